"""The real thing on the CPU backend: the CLI, child processes, a hard memory cap, small models.

Each probe here starts real child processes that run real training steps. What
stays here is what only real children show: a real out-of-memory edge that
holds in fresh processes, the JSON and the progress lines of a real run, a
real error's traceback, the real ambiguous oneDNN-style error that a larger
cap cures, a factory the real environment check cannot import. What isoprobe
decides from trials (the start batch not fitting, the dataset_size cap, an
ambiguous error that persists, the recommendation) is tested with a scripted
executor in tests/unit/test_orchestration_answers.py.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from conftest import MODELS, hog_spec, run_cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    """One probe that finds a real out-of-memory edge (around batch 25 under 1.5 GiB)."""
    spec = hog_spec(start_batch_size=16)
    spec["recommendation"] |= {"headroom": 0.1, "multiple_of": 4}
    path = tmp_path_factory.mktemp("edge") / "hog.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path, run_cli("run", str(path))


def test_answers_with_exit_0_and_exactly_one_json_document(edge):
    _, run = edge
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)  # one document, nothing else on stdout
    assert result["answered"] is True
    assert result["stop_reason"] == "edge_found"
    assert result["device"]["backend"] == "cpu"
    # On the CPU backend every trial (and the environment check) is forked from the fork server by default;
    # test_maximum_fits_and_maximum_plus_one_fails_in_fresh_processes re-runs the edge in new probes.
    assert all(t["forked"] and t["warm_start"] for t in result["trials"])
    assert result["device"]["memory_budget_bytes"] == int(1.5 * 1024**3)


def test_result_validates_against_the_published_schema(edge):
    _, run = edge
    schema = run_cli("schema")
    assert schema.returncode == 0
    jsonschema.validate(run.json, json.loads(schema.stdout))


def test_edge_is_adjacent_and_every_reported_batch_was_run(edge):
    _, run = edge
    result = run.json
    maximum, failing = result["max_batch_size"], result["first_failing_batch_size"]
    assert failing == maximum + 1
    outcomes = {(t["batch_size"], t["outcome"]) for t in result["trials"]}
    assert (maximum, "fits") in outcomes
    assert (failing, "out_of_memory") in outcomes
    assert not any(t["outcome"] == "fits" and t["batch_size"] > maximum for t in result["trials"])
    recommended = result["recommended_batch_size"]
    assert recommended is not None and recommended <= maximum
    assert recommended % 4 == 0  # recommendation.multiple_of
    assert (recommended, "fits") in outcomes
    assert result["recommendation"]["measured_peak_bytes"] > 0
    fitting_peaks = [t["peak_bytes"] for t in result["trials"] if t["outcome"] == "fits"]
    assert all(p is not None and p > 0 for p in fitting_peaks)
    # search.steps is what the child really runs: every fitting trial timed exactly that many steps.
    steps = result["spec"]["search"]["steps"]
    assert all(len(t["step_seconds"]) == steps for t in result["trials"]
               if t["outcome"] == "fits" and t["steady_rule"] is None)  # the confirmation steps until steady


def test_progress_is_one_stderr_line_per_trial(edge):
    _, run = edge
    trial_lines = [line for line in run.stderr.splitlines() if line.startswith("isoprobe: trial ")]
    assert len(trial_lines) == len(run.json["trials"])
    assert "batch" in trial_lines[0] and "peak" in trial_lines[0]


def test_maximum_fits_and_maximum_plus_one_fails_in_fresh_processes(edge, write_spec):
    _, run = edge
    maximum = run.json["max_batch_size"]
    at_max = run_cli("run", str(write_spec(hog_spec(start_batch_size=maximum, max_batch_size=maximum), "max.yaml")))
    assert at_max.returncode == 0, at_max.stderr
    assert at_max.json["max_batch_size"] == maximum
    assert at_max.json["limited_by"] == "max_batch_size"
    above = maximum + 1
    past_max = run_cli(
        "run", str(write_spec(hog_spec(start_batch_size=above, max_batch_size=above), "above.yaml"))
    )
    assert past_max.returncode == 3, past_max.stderr
    assert past_max.json["stop_reason"] == "start_does_not_fit"
    assert [t["outcome"] for t in past_max.json["trials"]] == ["out_of_memory"]


def test_a_bug_in_the_model_is_an_error_with_exit_4_not_out_of_memory(write_spec):
    spec = hog_spec()
    spec["model"] = {"factory": f"{MODELS}:broken"}
    spec["input"] = {"shape": [16]}
    spec["target"] = {"classes": 4}
    run = run_cli("run", str(write_spec(spec)))
    assert run.returncode == 4, run.stderr
    result = run.json
    assert result["stop_reason"] == "error"
    assert result["answered"] is False and result["max_batch_size"] is None
    [trial] = result["trials"]  # an error stops the search at once
    assert trial["outcome"] == "error"
    assert trial["error"]["type"] == "ValueError"
    assert "deliberate bug" in trial["error"]["traceback_tail"]
    assert "Traceback" not in run.stderr.split("isoprobe: trial")[0]  # no traceback from isoprobe itself


def _ambiguous_spec(threshold: int) -> dict:
    spec = hog_spec(start_batch_size=4, max_batch_size=4)
    spec["model"] = {"factory": f"{MODELS}:ambiguous_under_cap", "kwargs": {"threshold": threshold}}
    spec["input"] = {"shape": [16]}
    spec["target"] = {"classes": 4}
    return spec


def test_ambiguous_library_error_caused_by_the_cap_is_reclassified_with_evidence(write_spec):
    # Fails under the 1.5 GiB cap, runs under twice that: the evidence says 'memory'.
    run = run_cli("run", str(write_spec(_ambiguous_spec(threshold=int(2 * 1024**3)))))
    assert run.returncode == 3, run.stderr
    first, check = run.json["trials"]
    assert first["outcome"] == "out_of_memory" and "fit with" in first["reclassified"]
    assert check["purpose"] == "memory_check" and check["outcome"] == "fits"
    assert run.json["max_batch_size"] is None  # a fit with more memory never counts


def test_a_factory_that_cannot_be_imported_is_a_spec_error_before_any_trial(write_spec, tmp_path):
    (tmp_path / "models_with_typo.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(2, 2)\n")
    spec = hog_spec()
    spec["model"] = {"factory": "models_with_typo.py:biuld"}
    run = run_cli("run", str(write_spec(spec)))
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    assert "model" in run.stderr and "biuld" in run.stderr
    assert "Traceback" not in run.stderr
