"""search.parallel: 2 on the CPU backend with real children: the same answer as one slot (issue 17).

Wall time is measured by benchmarks, not asserted here (two trials share the machine's two cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run(spec: Path, slots: int) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-m", "isoprobe", "run", str(spec), "--no-cache", "--format", "json",
                           "--set", f"search.parallel={slots}"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_two_cpu_slots_give_the_one_slot_answer(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "model": {"factory": f"{ROOT / 'specs' / 'tiny_models.py'}:small_cnn", "kwargs": {"channels": 32, "classes": 10}},
        "input": {"shape": [3, 64, 64]}, "target": {"classes": 10}, "optimizer": {"name": "sgd"},
        "search": {"steps": 2, "trial_timeout": 120, "max_batch_size": 4096},
        "device": "cpu", "memory_budget": "1.25GiB", "recommendation": {"soak_steps": 0},
    }))
    one, _ = run(spec, 1)
    two, progress = run(spec, 2)
    assert "2 slots: up to 2 trials at once" in progress
    assert two["stop_reason"] == one["stop_reason"] == "edge_found"
    assert (two["max_batch_size"], two["first_failing_batch_size"]) == (one["max_batch_size"], one["first_failing_batch_size"])
    assert all(t["outcome"] == "fits" for t in two["trials"] if t["batch_size"] == two["max_batch_size"])
