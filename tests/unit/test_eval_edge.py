"""training.eval_pass over scripted trials: the evaluation batch's own edge, and a training answer it never lowers.

The scripted device: a training step peaks at ``fixed + TRAIN·batch``; an evaluation
trial (``TrialRequest.eval_batch_size``) peaks at the larger of its training steps'
peak and ``fixed + EVAL·eval_batch``. Under the 1.5 GiB budget the edges are known
exactly, so the answers are checked against them, not against what the probe said.
"""

from __future__ import annotations

from isoprobe.executors.scripted import Call, ScriptedExecutor, error, fits, linear, out_of_memory
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


def raising_in_evaluation(above: int):
    """``device``, except that an evaluation pass at a batch above ``above`` raises the user's non-memory error."""

    def run(call: Call):
        if call.request.eval_batch_size is not None and call.request.eval_batch_size > above:
            return error("the user's evaluation forward is broken", "ValueError")
        return device(call)

    return run


def test_an_evaluation_forward_that_raises_is_the_users_error_exit_4_not_no_evaluation_batch_fit():
    """Issue 34: every evaluation trial raised a ValueError, and the probe said exit 0, 'no evaluation batch fit
    ... evaluate with a smaller batch': the user's bug read as a memory verdict. It is the trials' error, exit 4,
    with the exception in the message, and nothing exported."""
    probed = probe(eval_spec(), ScriptedExecutor(raising_in_evaluation(0)))
    result = probed.result
    assert probed.exit_code == 4 and result.stop_reason is StopReason.ERROR
    assert "no evaluation batch fit" not in result.message
    assert "raised ValueError: the user's evaluation forward is broken" in result.message, result.message
    assert "evaluation" in result.message.split("raised")[0]
    assert result.max_batch_size == TRAIN_EDGE  # the training answer is kept, in the JSON, as after a soak's error
    assert result.eval_max_batch_size is None and result.eval_stop_reason is StopReason.ERROR
    assert dict(result_variables(result)).get("ISOPROBE_EVAL_BATCH_SIZE") is None
    assert dict(result_variables(result)).get("ISOPROBE_BATCH_SIZE") is None


def test_an_evaluation_that_raises_above_a_batch_that_fitted_is_no_evaluation_answer():
    """The same class, further up: evaluation at 56 fits, 72 raises. Before: exit 0, 'evaluation batch
    56 fits (the cap: none above it was tried)' and ISOPROBE_EVAL_BATCH_SIZE=56, though a larger batch was tried
    and raised. Now the error decides (exit 4), and the batch that fitted is still in the JSON."""
    probed = probe(eval_spec(), ScriptedExecutor(raising_in_evaluation(60)))
    result = probed.result
    assert probed.exit_code == 4 and result.stop_reason is StopReason.ERROR
    failed = [t for t in result.trials if t.training_batch_size is not None and t.outcome is Outcome.ERROR]
    assert failed and f"evaluation batch {failed[-1].batch_size} (after training steps" in result.message
    assert "raised ValueError: the user's evaluation forward is broken" in result.message, result.message
    assert "none above it was tried" not in result.message
    assert result.eval_max_batch_size == 56 and "evaluation batch 56 fit before it" in result.message
    assert dict(result_variables(result)).get("ISOPROBE_EVAL_BATCH_SIZE") is None
