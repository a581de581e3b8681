"""Issue 6 on the CPU backend: what the child measures for the answers' extras.

One real probe of a small MLP under Adam (objective throughput, an accumulation
plan and allocator candidates in the spec, so the whole path runs for real);
the sizes the child measured are checked against the model's own arithmetic
(parameters = count x 4 bytes for float32, Adam's state = two tensors per
parameter), and every fitting trial's timings are the steps it really ran.
What isoprobe computes from those measurements (samples per second, the
throughput curve, the objective, the plan, the CPU allocator note, the table
and show views) is tested with a scripted executor in
tests/unit/test_orchestration_answers.py.
"""

from __future__ import annotations

import json

import pytest

from conftest import MODELS, run_cli


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
        # The doubling search measures several batches below the cap (the guided one, started from the traced
        # estimate, may run the cap alone: one fitting batch, no slope for the breakdown to show).
        # No long run of the maximum (steady_steps 0): every fitting trial then runs exactly search.steps.
        "search": {"start_batch_size": 2, "max_batch_size": 64, "steps": 3, "confirmations": 0,
                   "strategy": "doubling", "steady_steps": 0},
        "device": "cpu",
        "memory_budget": "1.5GiB",
        "recommendation": {"objective": "throughput", "throughput_tolerance": 0.5, "soak_steps": 0},
        "plan": {"target_global_batch": 1000, "world_size": 4},
        "allocators": ["default", "expandable_segments:True"],
    }
    path = tmp_path_factory.mktemp("answers") / "spec.yaml"
    path.write_text(json.dumps(spec))
    run = run_cli("run", str(path))
    assert run.returncode == 0, run.stderr
    return path, run.json


def test_every_fitting_trial_reports_the_steps_it_timed_and_its_throughput(probed):
    _, result = probed
    fitting = [t for t in result["trials"] if t["outcome"] == "fits"]
    assert fitting and all(t["samples_per_second"] > 0 for t in fitting)
    steps = result["spec"]["search"]["steps"]
    # search.steps is what the child really runs (no trial steps until steady: steady_steps 0).
    assert all(len(t["step_seconds"]) == steps and t["steady_rule"] is None for t in fitting)


def test_the_breakdown_matches_the_models_arithmetic(probed):
    _, result = probed
    breakdown = result["memory_breakdown"]
    assert breakdown["parameter_bytes"] == PARAMETERS * 4
    assert breakdown["gradient_bytes"] == PARAMETERS * 4
    assert breakdown["optimizer_state_bytes"] == 2 * PARAMETERS * 4  # exp_avg and exp_avg_sq
    assert breakdown["activation_bytes_per_sample"] > 0
    assert breakdown["fixed_bytes"] > breakdown["parameter_bytes"] * 4  # weights+grads+state+runtime
