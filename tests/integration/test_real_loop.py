"""Issue 15 end to end on the CPU backend: the answer holds in the user's real loop.

Real children under a real cap. Each edge found by a probe that no plain harness
can reproduce (freed_before_backward, a user step) is re-run in fresh processes
(the maximum fits, one more does not), so the test checks the step isoprobe ran
against the memory it really needs. The default lifetime's edge (through_backward)
is checked against a plain training process, which shares no code with isoprobe,
in tests/integration/test_plain_edge.py (its lm-head case: the same model).

The probes and re-runs here compare ``search.steps`` (2) steps on both sides: no
steady-state confirmation (``search.steady_steps: 0``: the long run is checked by
tests/unit/test_steady_state.py, test_probe_cpu.py and, against a plain loop,
test_distributed.py), and a soak only where the soak is under test.
"""

from __future__ import annotations

import json

import pytest

from conftest import MODELS, REPO, run_cli
from isoprobe.spec.model import Spec


GiB = 1024**3
BUDGET = int(1.5 * GiB)


class Rerun(str):
    """A re-run's outcome (compares equal to it), with its budget peak in the test's report."""

    peak: int | None

    def __repr__(self) -> str:
        peak = "no peak" if self.peak is None else f"budget peak {self.peak} of {BUDGET}"
        return f"{str.__repr__(self)} ({peak})"


def outcome_of(spec: dict, batch: int, workdir) -> Rerun:
    """``spec`` at ``batch`` alone, in a new probe: one trial in a fresh child, classified as a probe does.

    A whole probe rather than a bare child, so that the re-run is started exactly as the probe's own
    trial was (preloaded imports, a warm spare, the cap): CI once saw three edges disagree, every time in
    the same direction, with re-runs in bare children started without the probe's preload.
    """
    # No trace (the start is given) and no steady confirmation of a batch that fits (only the search's trial counts).
    alone = {**spec, "search": {**spec["search"], "start_batch_size": batch, "max_batch_size": batch,
                                "estimate": False, "steady_steps": 0}}
    path = workdir / f"alone-{batch}.yaml"
    path.write_text(json.dumps(alone))
    run = run_cli("run", str(path))
    assert run.returncode in (0, 3), run.stderr
    # The search's one trial at ``batch``.
    [trial] = [t for t in run.json["trials"] if t["purpose"] == "search"]
    outcome = Rerun(trial["outcome"])
    outcome.peak = trial["budget_peak_bytes"]
    return outcome


def probe(spec: dict, folder) -> dict:
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    run = run_cli("run", str(path))
    assert run.returncode == 0, run.stderr
    return run.json


def trials_of(result: dict) -> list[tuple]:
    """The probe's trials as (batch, outcome, budget peak): what a failing comparison prints."""
    return [(t["batch_size"], t["outcome"], t["budget_peak_bytes"]) for t in result["trials"]]


def _search(start: int, **extra) -> dict:
    """Two steps a trial and nothing after the edge is found: the re-runs check the 2-step edge."""
    return {"steps": 2, "trial_timeout": 120, "start_batch_size": start, "confirmations": 0, "steady_steps": 0,
            **extra}


# --------------------------------------------------------------------------- output lifetime


def lm_spec(lifetime: str) -> dict:
    """A language-model head (8000 logits per token, 64 tokens): the logits are most of the step's memory."""
    return {
        "model": {"factory": f"{MODELS}:lm_head", "kwargs": {"vocabulary": 8000, "width": 64}},
        "input": {"shape": [64], "dtype": "int64", "high": 8000},
        "target": {"task": "language_modeling"},
        "optimizer": {"name": "adam"},
        "training": {"output_lifetime": lifetime},
        # One 2-step confirmation of the maximum: the fresh-process re-run of it must fit, so a batch that fits
        # only by chance (its peak within the spread of the cap) is not reported.
        "search": _search(48, confirmations=1),
        "device": "cpu",
        "memory_budget": "1.5GiB",
        "recommendation": {"soak_steps": 0},
    }


@pytest.fixture(scope="module")
def lifetimes(tmp_path_factory):
    return {lifetime: probe(lm_spec(lifetime), tmp_path_factory.mktemp(lifetime))
            for lifetime in ("through_backward", "freed_before_backward")}


def test_holding_the_output_through_backward_lowers_the_edge(lifetimes):
    held, freed = lifetimes["through_backward"], lifetimes["freed_before_backward"]
    for result in (held, freed):
        assert result["stop_reason"] == "edge_found"
    # Measured here: 84 against 112 (the logits, 2 MiB a sample, live through the backward pass).
    assert held["max_batch_size"] < freed["max_batch_size"], (held["max_batch_size"], freed["max_batch_size"])
    for lifetime, result in lifetimes.items():
        assert {t["applied"]["output_lifetime"] for t in result["trials"] if t["applied"]} == {lifetime}


def test_the_default_is_through_backward():
    assert Spec.model_validate({k: v for k, v in lm_spec("through_backward").items()
                                if k != "training"}).training.output_lifetime == "through_backward"


def test_the_freed_lifetimes_edge_is_exact_in_fresh_processes(lifetimes, tmp_path):
    """freed_before_backward's maximum fits in a fresh process and one more does not.

    through_backward's edge on this model is checked against a plain training loop (which this lifetime
    cannot be: benchmarks/harness/plain_edge.py refuses it) by test_plain_edge.py's lm-head case; re-running it here
    too was isoprobe checking itself a second time.
    """
    result = lifetimes["freed_before_backward"]
    maximum = result["max_batch_size"]
    spec = lm_spec("freed_before_backward")
    assert outcome_of(spec, maximum, tmp_path) == "fits", trials_of(result)
    assert outcome_of(spec, maximum + 1, tmp_path) == "out_of_memory", trials_of(result)


# --------------------------------------------------------------------------- the user's own step


def hog_spec(step: str | None) -> dict:
    """memory_hog with a 100-class head: 105 MiB of weights, so a whole extra copy of them (EMA) shows."""
    spec = {
        "model": {"factory": f"{MODELS}:memory_hog", "kwargs": {"features": 262144, "depth": 8, "classes": 100}},
        "input": {"shape": [262144]},
        "target": {"classes": 100},
        "optimizer": {"name": "sgd"},
        "search": _search(16),
        "device": "cpu",
        "memory_budget": "1.5GiB",
        "recommendation": {"soak_steps": 0},
    }
    if step is not None:
        spec["model"]["step"] = step
    return spec


#: The shipped example of a user step (specs/resnet18-ema-clip.yaml): clipping and an EMA copy of the weights.
EMA_STEP = f"{REPO / 'specs' / 'train_steps.py'}:ema_clip_step"


def test_a_user_step_with_an_ema_copy_has_a_lower_exact_edge_than_the_built_in_step(tmp_path):
    result = probe(hog_spec(EMA_STEP), tmp_path)
    maximum = result["max_batch_size"]
    assert result["stop_reason"] == "edge_found"
    assert {t["applied"]["output_lifetime"] for t in result["trials"] if t["applied"]} == {"user_step"}
    # Exact for the user's step, in fresh processes...
    assert outcome_of(hog_spec(EMA_STEP), maximum + 1, tmp_path) == "out_of_memory", trials_of(result)
    # ...and below the built-in step's edge (measured here: 21 against 31).
    assert outcome_of(hog_spec(None), maximum + 1, tmp_path) == "fits", trials_of(result)


def test_a_step_whose_signature_cannot_take_the_batch_is_a_spec_error_before_any_trial(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(hog_spec(f"{MODELS}:step_without_batch")))
    run = run_cli("run", str(path))
    assert run.returncode == 2, run.stderr
    assert "model.step" in run.stderr and "f(model, optimizer, batch, device)" in run.stderr
    assert "trial" not in run.stderr.replace("before any trial", "")
    assert run.json["stop_reason"] == "bad_spec"  # every stop prints its document (issue 56)


# --------------------------------------------------------------------------- the soak


def test_a_soak_catches_memory_that_grows_every_step_and_moves_the_recommendation_down(tmp_path):
    spec = {
        "model": {"factory": f"{MODELS}:leaky_hog", "kwargs": {"features": 524288, "depth": 8, "leak_mib": 48}},
        "input": {"shape": [524288]},
        "target": {"classes": 10},
        "optimizer": {"name": "sgd"},
        # The soak is under test: without steady_steps 0 the edge's confirmation steps on, sees the leak
        # itself and the probe stops with still_rising (tests/unit/test_steady_state.py covers that).
        "search": {**_search(8), "steady_steps": 0},
        "device": "cpu",
        "memory_budget": "1.5GiB",  # soak_steps left out: the CPU default, 6
    }
    result = probe(spec, tmp_path)
    recommendation = result["recommendation"]
    soaks = recommendation["soaks"]
    assert recommendation["soak_steps"] == 6
    assert not soaks[0]["survived"] and soaks[-1]["survived"], soaks
    assert result["recommended_batch_size"] == soaks[-1]["batch_size"] < soaks[0]["batch_size"]
    first = result["trials"][soaks[0]["trial"] - 1]
    assert first["purpose"] == "soak" and len(first["step_peak_bytes"]) >= 3
    rises = [b - a for a, b in zip(first["step_peak_bytes"][1:], first["step_peak_bytes"][2:])]
    assert all(rise >= 40 * 2**20 for rise in rises), rises  # ~48 MiB a step after the warm-up, visible per step
    last = result["trials"][soaks[-1]["trial"] - 1]
    assert last["outcome"] == "fits" and len(last["step_peak_bytes"]) == 6
    assert soaks[-1]["still_rising"]  # and flagged: it leaks at any batch
