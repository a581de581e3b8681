"""``isoprobe.report.plot``: the picture of a result (optional extra ``isoprobe[plot]``).

The fixture ``data/result-small-cnn.json`` is a real CPU result (an edge found,
a memory check, a recommendation check; written before throughput existed, so
it has no samples per second and no memory breakdown). The other results are
derived from it and validated against ``Result`` before they are drawn, so the
plot is only ever tested on documents the probe could have printed.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

from isoprobe.report.plot import PlotUnavailable, default_output, main_plot, render  # noqa: E402
from isoprobe.report.result import Result  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "result-small-cnn.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ORANGE = (255, 127, 14)  # matplotlib's tab:orange: the samples-per-second series


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def _valid(result: dict) -> dict:
    """The dict as the probe would print it: validated, then dumped back."""
    return Result.model_validate(result).model_dump(mode="json")


def _check_png(path: Path) -> Image.Image:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = Image.open(path)
    image.load()
    assert image.format == "PNG"
    width, height = image.size
    assert 800 <= width <= 3000 and 500 <= height <= 2000, image.size
    return image.convert("RGB")


def _has_colour(image: Image.Image, rgb: tuple[int, int, int], tolerance: int = 12) -> bool:
    import numpy as np

    pixels = np.asarray(image, dtype=np.int16)
    return bool((np.abs(pixels - np.array(rgb, dtype=np.int16)) <= tolerance).all(axis=-1).any())


def _cuda_result() -> dict:
    """The fixture moved to CUDA, with throughput and the memory breakdown of the current schema."""
    result = _fixture()
    gib = 1024**3
    result["device"].update(
        backend="cuda", requested="cuda", name="NVIDIA H100 80GB HBM3", index=0,
        total_memory_bytes=80 * gib, memory_budget_bytes=None, budget_source=None,
        capacity_bytes=80 * gib, import_baseline_bytes=None, note=None,
    )
    speeds = {}
    for trial in result["trials"]:
        if trial["outcome"] == "fits":
            trial["peak_bytes"] = trial["budget_peak_bytes"] = int(2 * gib + 0.5 * gib * trial["batch_size"] / 10)
            trial["samples_per_second"] = 900.0 * trial["batch_size"] / (trial["batch_size"] + 20)
            trial["step_seconds_spread"] = 0.02
            if trial["purpose"] != "memory_check":
                speeds[trial["batch_size"]] = max(speeds.get(trial["batch_size"], 0), trial["samples_per_second"])
    result["memory_breakdown"] = {
        "parameter_bytes": 10_000_000, "gradient_bytes": 10_000_000, "optimizer_state_bytes": 0,
        "activation_bytes_per_sample": 0.05 * gib, "fixed_bytes": 2.0 * gib, "from_batch_size": 136,
    }
    result["throughput"] = {
        "points": [{"batch_size": b, "samples_per_second": s} for b, s in sorted(speeds.items())],
        "best_samples_per_second": max(speeds.values()),
        "fastest_batch_size": 73,
        "tolerance": 0.03,
        "note": "tested batch sizes only",
    }
    return _valid(result)


# --------------------------------------------------------------------------- render


def test_fixture_is_a_current_result():
    Result.model_validate_json(FIXTURE.read_text())


def test_render_writes_a_png(tmp_path):
    written = render(_valid(_fixture()), tmp_path / "probe.png")
    assert written == tmp_path / "probe.png"
    image = _check_png(written)
    assert not _has_colour(image, ORANGE), "no trial has samples per second: no throughput axis"


def test_render_accepts_a_result_model(tmp_path):
    written = render(Result.model_validate_json(FIXTURE.read_text()), str(tmp_path / "model.png"))
    _check_png(written)


def test_render_with_throughput_and_memory_breakdown(tmp_path):
    image = _check_png(render(_cuda_result(), tmp_path / "cuda.png"))
    assert _has_colour(image, ORANGE), "samples per second are drawn on the right axis"


def test_render_without_fitting_trials_line_or_throughput(tmp_path):
    result = _fixture()
    result["trials"] = [t for t in result["trials"] if t["outcome"] == "out_of_memory"]
    result.update(
        answered=False, max_batch_size=None, first_failing_batch_size=None, first_failing_outcome=None,
        recommended_batch_size=None, recommendation=None, stop_reason="start_does_not_fit",
        message="not even batch 2 fits",
    )
    _check_png(render(_valid(result), tmp_path / "none-fit.png"))


def test_render_with_one_fitting_trial_and_no_line(tmp_path):
    result = _fixture()
    result["trials"] = result["trials"][:1] + [dict(result["trials"][3], index=2, batch_size=3)]
    result["recommendation"]["memory_model"] = None
    result.update(max_batch_size=2, first_failing_batch_size=3, recommended_batch_size=2)
    _check_png(render(_valid(result), tmp_path / "one-point.png"))


def test_render_without_trials_or_device(tmp_path):
    result = _fixture()
    result.update(
        device=None, trials=[], answered=False, max_batch_size=None, first_failing_batch_size=None,
        first_failing_outcome=None, recommended_batch_size=None, recommendation=None,
        stop_reason="interrupted", message="stopped by SIGINT during the environment check, before any trial",
    )
    _check_png(render(_valid(result), tmp_path / "empty.png"))


# --------------------------------------------------------------------------- main_plot


def test_main_plot_default_output_is_next_to_the_result(tmp_path, capsys):
    source = tmp_path / "run-1.json"
    source.write_text(FIXTURE.read_text())
    assert main_plot(str(source), None) == 0
    _check_png(tmp_path / "run-1.png")
    assert "run-1.png" in capsys.readouterr().err


def test_main_plot_explicit_output(tmp_path):
    assert main_plot(str(FIXTURE), str(tmp_path / "probe.png")) == 0
    _check_png(tmp_path / "probe.png")


def test_default_output_never_overwrites_the_input():
    assert default_output("out/result.json") == Path("out/result.png")
    assert default_output("result") == Path("result.png")
    assert default_output("odd.png") == Path("odd.png.png")


def test_main_plot_rejects_a_document_that_is_not_a_result(tmp_path):
    from pydantic import ValidationError

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"trials": []}))
    with pytest.raises(ValidationError):
        main_plot(str(bad), str(tmp_path / "bad.png"))
    assert not (tmp_path / "bad.png").exists()


# --------------------------------------------------------------------------- without matplotlib


def test_plot_unavailable_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # 'import matplotlib' now raises ImportError
    with pytest.raises(PlotUnavailable, match=r"pip install 'isoprobe\[plot\]'"):
        render(copy.deepcopy(_fixture()), tmp_path / "never.png")
    # main_plot says so before reading anything: the missing file is not the error reported.
    with pytest.raises(PlotUnavailable, match=r"isoprobe\[plot\]"):
        main_plot(str(tmp_path / "missing.json"), None)
    assert not (tmp_path / "never.png").exists()


def test_importing_the_module_does_not_import_matplotlib():
    code = "import sys, isoprobe.report.plot; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_frontier_document_is_drawn_as_the_maximum_over_the_values(tmp_path):
    """``isoprobe plot FRONTIER.json``: the maximum (blue) over the values, tokens per batch (orange) beside it."""
    from isoprobe.report.frontier import FrontierResult

    point = _valid(_fixture())
    points = [{"value": length, "probed": 4 - i, "max_batch_size": 40 >> i, "recommended_batch_size": 30 >> i,
               "tokens_per_batch": (40 >> i) * length, "trials": 3, "seconds": 10.0, "result": point}
              for i, length in enumerate((128, 256, 512, 1024))]
    document = FrontierResult.model_validate({"spec_path": "lm.yaml", "field": "input.shape.0",
                                              "direction": "increasing", "answered": True, "points": points,
                                              "total_trials": 12, "total_seconds": 40.0})
    saved = tmp_path / "frontier.json"
    saved.write_text(document.model_dump_json())
    done = subprocess.run([sys.executable, "-m", "isoprobe", "plot", str(saved)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    image = _check_png(tmp_path / "frontier.png")
    assert _has_colour(image, (31, 119, 180)) and _has_colour(image, ORANGE)
