"""training.eval_pass over scripted trials: the evaluation batch's own edge, and a training answer it never lowers.

The scripted device: a training step peaks at ``fixed + TRAIN·batch``; an evaluation
trial (``TrialRequest.eval_batch_size``) peaks at the larger of its training steps'
peak and ``fixed + EVAL·eval_batch``. Under the 1.5 GiB budget the edges are known
exactly, so the answers are checked against them, not against what the probe said.
"""

from __future__ import annotations

from isoprobe.executors.scripted import Call, ScriptedExecutor, fits, linear, out_of_memory
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report.shell import result_variables
from scripted_probe import HOG_FIXED, HOG_PER_SAMPLE, hog_spec, probe

BUDGET = int(1.5 * 1024**3)
EVAL_PER_SAMPLE = 8 * 1024**2  # a quarter of a training sample: no activations kept for a backward pass
TRAIN_EDGE = (BUDGET - HOG_FIXED) // HOG_PER_SAMPLE
EVAL_EDGE = (BUDGET - HOG_FIXED) // EVAL_PER_SAMPLE


def device(call: Call):
    request = call.request
    if request.eval_batch_size is None:
        return linear(HOG_FIXED, HOG_PER_SAMPLE)(call)
    peak = max(HOG_FIXED + HOG_PER_SAMPLE * request.batch_size, HOG_FIXED + EVAL_PER_SAMPLE * request.eval_batch_size)
    return out_of_memory(at_step=1) if peak > call.budget else fits(peak, base_bytes=HOG_FIXED)


def eval_spec(**training) -> dict:
    spec = hog_spec()
    spec["training"] = {"eval_pass": True, **training}
    return spec


def test_the_evaluation_edge_is_its_own_and_the_training_answer_is_what_it_is_without():
    with_eval = probe(eval_spec(), ScriptedExecutor(device)).result
    without = probe(hog_spec(), ScriptedExecutor(device)).result
    assert with_eval.max_batch_size == without.max_batch_size == TRAIN_EDGE
    assert with_eval.recommended_batch_size == without.recommended_batch_size
    assert with_eval.eval_max_batch_size == EVAL_EDGE and with_eval.eval_first_failing_batch_size == EVAL_EDGE + 1
    assert with_eval.eval_stop_reason is StopReason.EDGE_FOUND
    assert with_eval.eval_training_batch_size == with_eval.recommended_batch_size
    evals = [t for t in with_eval.trials if t.training_batch_size is not None]
    assert evals and all(t.training_batch_size == with_eval.recommended_batch_size for t in evals)
    assert all(t.training_batch_size is None for t in with_eval.trials[: len(with_eval.trials) - len(evals)])
    assert with_eval.throughput == without.throughput  # the evaluation trials' steps are not the batch's
    assert any(t.batch_size == EVAL_EDGE and t.outcome is Outcome.FITS for t in evals)
    assert ("ISOPROBE_EVAL_BATCH_SIZE", str(EVAL_EDGE)) in result_variables(with_eval)
    assert "ISOPROBE_EVAL_BATCH_SIZE" not in dict(result_variables(without))


def test_the_training_trials_run_no_evaluation_pass_and_the_evaluation_trials_do():
    executor = ScriptedExecutor(device)
    probe(eval_spec(eval_grad="inference_mode"), executor)
    requests = [c.request for c in executor.calls]
    training = [r for r in requests if r.eval_batch_size is None]
    evaluation = [r for r in requests if r.eval_batch_size is not None]
    assert training and evaluation and requests[: len(training)] == training  # the evaluation search comes after
    assert {r.batch_size for r in evaluation} == {probe(eval_spec(), ScriptedExecutor(device))
                                                  .result.recommended_batch_size}
    assert all(r.spec.training.eval_grad == "inference_mode" for r in evaluation)
