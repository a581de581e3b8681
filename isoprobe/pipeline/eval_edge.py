"""The evaluation batch (``training.eval_pass``): a second edge, searched in its own trials after the training one.

A job validates with its training state in memory: weights, gradients,
optimizer state. So each evaluation trial runs the training steps at the
training answer (the recommended batch, else the maximum), drops that batch,
and runs one evaluation pass (eval mode, ``training.eval_grad``) at the batch
under test (``child.core.trial``); its verdict is the evaluation's. The training
trials run no evaluation pass any more: the training answer is never lowered
by evaluation, and the evaluation answer is proven on its own.

The search is the same pure edge search as the training one; it borrows the
training maximum as a fit it expects (an evaluation pass keeps no activations
for a backward pass, so it usually takes more samples), which steers it
upwards and is proven, or dropped, by its own trials (``search.frontier_bounds``).
"""

from __future__ import annotations

from dataclasses import dataclass

from isoprobe.pipeline.data import data_cap
from isoprobe.pipeline.environment import Target
from isoprobe.pipeline.trials import TrialRunner
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report.trial import Trial
from isoprobe.search.edge_search import run_search
from isoprobe.search.history import Borrowed, Limits, Observation
from isoprobe.search.steps import doubling_step, guided_step
from isoprobe.spec.model import Spec


@dataclass(frozen=True)
class EvalEdge:
    """The evaluation search's answer."""

    stop: StopReason
    max_fitting: int | None
    first_failing: int | None
    training_batch: int


def wants_eval_search(spec: Spec) -> bool:
    """eval_pass with isoprobe's own step; an hf_trainer's Trainer evaluates at its own eval batch in each trial."""
    return spec.training.eval_pass and spec.model.hf_trainer is None


def eval_search(spec: Spec, target: Target, runner: TrialRunner, training_batch: int, training_max: int) -> EvalEdge:
    """The largest evaluation batch after the training steps at ``training_batch``, in fresh processes."""
    limits = Limits(
        start=spec.search.start_batch_size,
        cap=data_cap(spec.search.cap, target.data),  # with spec.data, no batch larger than the dataset
        retries=spec.search.retries,
        confirmations=spec.search.confirmations_for("eval"),
        capacity=target.search_capacity,
        borrowed=Borrowed(fits=training_max) if training_max >= spec.search.start_batch_size else None,
    )
    step = guided_step if spec.search.strategy == "guided" else doubling_step
    runner.reporter.note(
        f"evaluation batch (training.eval_pass): each trial runs the training steps at batch "
        f"{training_batch}, then one evaluation pass ({spec.training.eval_grad}) at the batch tried"
    )
    history: list[Observation] = []
    runner.eval_after = training_batch
    try:
        conclusion = run_search(runner.observe, limits, history, step=step)
    finally:
        runner.eval_after = None
    return EvalEdge(conclusion.stop, conclusion.max_fitting, conclusion.first_failing, training_batch)


#: How an evaluation search that ended without a verdict on memory ends the probe: as the training search would
#: (exit 4). The user's code raised, crashed or hung in its evaluation pass: "no evaluation batch fit" would read
#: a bug as a memory verdict, and a batch that fitted below it is no answer while a larger one was not judged.
NO_EVAL_ANSWER = (StopReason.ERROR, StopReason.CRASHED, StopReason.TIMED_OUT)


def eval_failure(edge: EvalEdge, trials: list[Trial]) -> tuple[str, list[str]] | None:
    """The probe's message and suggestions when the evaluation search ended on an error, a crash or a time-out
    (``NO_EVAL_ANSWER``); None when it ended on memory (an answer, or no evaluation batch fit)."""
    if edge.stop not in NO_EVAL_ANSWER:
        return None
    wanted = Outcome(edge.stop.value)
    last = next((t for t in reversed(trials) if t.training_batch_size is not None and t.outcome is wanted), None)
    where = (
        f"evaluation batch {last.batch_size} (after training steps at batch {edge.training_batch})"
        if last is not None
        else f"the evaluation pass after training steps at batch {edge.training_batch}"
    )
    if edge.stop is StopReason.ERROR:
        error = last.error if last is not None else None
        detail = f"{error.type}: {error.message.splitlines()[0] if error.message else ''}" if error else "an error"
        fitted = f" (evaluation batch {edge.max_fitting} fit before it)" if edge.max_fitting is not None else ""
        return (
            f"{where} raised {detail} — an error in the evaluation pass (training.eval_pass), not a memory "
            f"verdict{fitted}",
            [
                "fix the error shown in the evaluation trial's error.traceback_tail (the last trial "
                "with training_batch_size set), then run again"
            ],
        )
    if edge.stop is StopReason.CRASHED:
        return (
            f"{where} crashed without a verdict (training.eval_pass)",
            ["see that trial's stderr_tail; a SIGKILL can be the kernel's OOM killer"],
        )
    return (
        f"{where} ran past the search.trial_timeout (training.eval_pass)",
        ["raise search.trial_timeout, or lower search.steps"],
    )


def eval_summary(edge: EvalEdge) -> str:
    """The evaluation answer in words, for the result's message."""
    if edge.max_fitting is None:
        return (
            f"no evaluation batch fit after training steps at batch {edge.training_batch} "
            f"({edge.stop.value}): evaluate with a smaller batch than search.start_batch_size, or train smaller"
        )
    above = (
        f" and {edge.first_failing} runs out of memory"
        if edge.first_failing is not None
        else " (the cap: none above it was tried)"
    )
    return f"evaluation batch {edge.max_fitting} fits{above} after training steps at batch {edge.training_batch}"
