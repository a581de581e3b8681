"""``isoprobe estimate`` with real children on the CPU backend, against lines measured by real trials.

The measured lines are stored results of ``isoprobe run`` (tests/data/result-small-cnn.json,
docs/results/resnet50-cpu.json), so no trial runs here: only the environment check's child,
seconds each. Stated tolerances: the per-sample cost within 20 % of the measured slope between
the two largest fitting batches, the predicted maximum within 25 % of the measured one (the
trace sees tensors only; measured here: small-cnn +14 %, ResNet50 +5 %).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _measured(path: Path) -> tuple[int, float]:
    """The stored probe's maximum and the slope of its budget peaks between its two largest fitting batches."""
    result = json.loads(path.read_text())
    peaks = {t["batch_size"]: t["budget_peak_bytes"] for t in result["trials"]
             if t["outcome"] == "fits" and t["budget_peak_bytes"] and t["purpose"] != "soak"}
    top, second = sorted(peaks)[-1], sorted(peaks)[-2]
    return result["max_batch_size"], (peaks[top] - peaks[second]) / (top - second)


@pytest.mark.parametrize("spec, stored, budget", [
    ("specs/small-cnn.yaml", "tests/data/result-small-cnn.json", None),
    ("specs/resnet50.yaml", "docs/results/resnet50-cpu.json", "3GiB"),
])
def test_the_estimate_is_close_to_the_measured_line(spec, stored, budget):
    args = ["estimate", str(ROOT / spec), "--format", "json", "--device", "cpu"]
    if budget:
        args += ["--memory-budget", budget]
    done = run_cli(*args, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    estimate = report["estimate"]
    measured_max, measured_slope = _measured(ROOT / stored)
    assert estimate["note"] is None, estimate["note"]
    assert abs(estimate["per_sample_bytes"] - measured_slope) <= 0.2 * measured_slope
    assert abs(report["predicted_max"] - measured_max) <= 0.25 * measured_max
    assert estimate["baseline_bytes"] == report["device"]["import_baseline_bytes"]
    assert estimate["seconds"] < 60  # bounded: the trace gives up after min(30 s, trial_timeout / 4)


def test_a_model_that_cannot_be_traced_still_probes(tmp_path):
    """The estimate falls back with its reason; the run's result says so and the search answers as without it."""
    (tmp_path / "models.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Reads(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.layer = nn.Linear(16, 4)\n\n"
        "    def forward(self, x):\n        scale = float(x.abs().max().item())  # a value read back\n"
        "        return self.layer(x) / (1.0 + scale)\n\n"
        "def reads():\n    return Reads()\n")
    (tmp_path / "spec.yaml").write_text(
        "model: {factory: models.py:reads}\ninput: {shape: [16]}\ntarget: {classes: 4}\n"
        "optimizer: {name: sgd}\ndevice: cpu\nmemory_budget: 1.25GiB\n"
        "search: {max_batch_size: 8, steps: 2}\nrecommendation: {soak_steps: 0}\n")
    done = run_cli("estimate", str(tmp_path / "spec.yaml"), "--format", "json", timeout=300)
    assert done.returncode == 4, done.stderr  # the report, but no estimate: not "answered"
    assert "isoprobe estimate: no estimate: " in done.stderr
    report = json.loads(done.stdout)
    assert report["predicted_max"] is None and "could not be traced" in report["estimate"]["note"]
    run = run_cli("run", str(tmp_path / "spec.yaml"), "--format", "json", timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["max_batch_size"] == 8 and result["trials"][0]["batch_size"] == 2  # today's start
    assert result["prediction"]["predicted_max"] is None and "could not be traced" in result["prediction"]["note"]
