"""Issue 6 end to end on the CPU backend: throughput, memory breakdown, accumulation plan, table view.

One real probe of a small MLP under Adam; the sizes the child measured are checked
against the model's own arithmetic (parameters = count x 4 bytes for float32,
Adam's state = two tensors per parameter).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from conftest import MODELS, REPO, run_cli

pytestmark = pytest.mark.integration

FEATURES = 2048
# big_linear(features) is nn.Linear(features, features): weight + bias.
PARAMETERS = FEATURES * FEATURES + FEATURES


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    spec = {
        "model": {"factory": f"{MODELS}:big_linear", "kwargs": {"features": FEATURES}},
        "input": {"shape": [FEATURES]},
        "target": {"shape": [FEATURES]},
        "optimizer": {"name": "adam"},
        "search": {"start_batch_size": 2, "max_batch_size": 64, "steps": 3, "confirmations": 0},
        "device": "cpu",
        "memory_budget": "1.5GiB",
        "recommendation": {"objective": "throughput", "throughput_tolerance": 0.5},
        "plan": {"target_global_batch": 1000, "world_size": 4},
        "allocators": ["default", "expandable_segments:True"],
    }
    path = tmp_path_factory.mktemp("answers") / "spec.yaml"
    path.write_text(json.dumps(spec))
    run = run_cli("run", str(path))
    assert run.returncode == 0, run.stderr
    return path, run.json


def test_every_fitting_trial_reports_its_throughput(probed):
    _, result = probed
    fitting = [t for t in result["trials"] if t["outcome"] == "fits"]
    assert fitting and all(t["samples_per_second"] > 0 for t in fitting)
    for t in fitting:  # batch / median of the timed steps (the first is warm-up)
        timed = statistics.median(t["step_seconds"][1:])
        assert t["samples_per_second"] == pytest.approx(t["batch_size"] / timed, rel=1e-2)
    curve = result["throughput"]
    assert {p["batch_size"] for p in curve["points"]} == {t["batch_size"] for t in fitting}
    assert curve["fastest_batch_size"] in {p["batch_size"] for p in curve["points"]}


def test_the_breakdown_matches_the_models_arithmetic(probed):
    _, result = probed
    breakdown = result["memory_breakdown"]
    assert breakdown["parameter_bytes"] == PARAMETERS * 4
    assert breakdown["gradient_bytes"] == PARAMETERS * 4
    assert breakdown["optimizer_state_bytes"] == 2 * PARAMETERS * 4  # exp_avg and exp_avg_sq
    assert breakdown["activation_bytes_per_sample"] > 0
    assert breakdown["fixed_bytes"] > breakdown["parameter_bytes"] * 4  # weights+grads+state+runtime


def test_the_plan_reaches_the_global_batch_within_the_recommendation(probed):
    _, result = probed
    plan = result["accumulation"]
    assert plan["world_size"] == 4 and plan["world_size_source"] == "spec"
    assert plan["micro_batch_size"] <= result["recommended_batch_size"]
    assert plan["global_batch_size"] == plan["micro_batch_size"] * plan["accumulation_steps"] * 4
    assert plan["difference"] == plan["global_batch_size"] - 1000


def test_objective_throughput_recommends_a_tested_batch_no_larger_than_the_headroom_one(probed):
    _, result = probed
    tested = {t["batch_size"] for t in result["trials"] if t["outcome"] == "fits"}
    assert result["recommended_batch_size"] in tested
    assert "objective throughput" in result["recommendation"]["note"] or \
        result["recommended_batch_size"] == result["throughput"]["fastest_batch_size"]


def test_show_renders_the_same_result_as_a_table(probed, tmp_path):
    _, result = probed
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(result))
    shown = run_cli("show", str(saved))
    assert shown.returncode == 0, shown.stderr
    for text in ("answer:", "samples/s", "memory breakdown", "optimizer state", "accumulation:",
                 str(result["max_batch_size"])):
        assert text in shown.stdout
    as_json = run_cli("show", str(saved), "--format", "json")
    assert json.loads(as_json.stdout) == result


def test_run_format_table_prints_the_table_and_auto_prints_json_into_a_pipe(probed):
    path, _ = probed
    table = subprocess.run([sys.executable, "-m", "isoprobe", "run", str(path), "--format", "table",
                            "--max-batch-size", "4"], cwd=REPO, capture_output=True, text=True)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("isoprobe ") and "memory breakdown" in table.stdout


def test_allocator_candidates_on_the_cpu_backend_are_reported_as_not_applying(probed):
    _, result = probed
    comparison = result["allocator_comparison"]
    assert comparison["applies"] is False and comparison["outcomes"] == []
    assert "CPU" in comparison["note"]
    assert all(t["allocator"] is None for t in result["trials"])  # searched once, with none of them
