"""What each kind of probe adds to the one pipeline, each in its own place.

``run_probe`` (``pipeline.pipeline``) checks the environment, then hands the trials to the kinds here, in order:

- **the main search**: the batch edge (``edge.search_and_recommend``: plain, a gang, a command), or, with
  ``search.unit: tokens``, the token budget (``tokens``);
- **allocators**: with ``allocators``, the same edge under each other setting (``edge.compare_allocators``);
- **evaluation**: with an eval batch to search, its own edge at the recommended training batch (``eval_edge``);
- **a command**: a batch the script proved it does not train at voids every credit (``report.batch_check``), and
  the message names the cycle seen at the maximum and an unclear batch check;
- **the frontier** calls ``run_probe`` once per point with ``borrowed`` bounds (``search.frontier``), which only
  narrow where the main search looks.

Each returns what it found in ``Probed``; a signal (SIGINT, SIGTERM) during a later kind keeps what the earlier
ones established and says so in the stop reason. ``message`` then composes the one message from each kind's part.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from isoprobe.errors import Terminated
from isoprobe.pipeline.edge import compare_allocators, search_and_recommend, stop_reason_of
from isoprobe.pipeline.environment import Target
from isoprobe.pipeline.eval_edge import EvalEdge, eval_failure, eval_search, eval_summary, wants_eval_search
from isoprobe.pipeline.explain import Found, explain, limited_by
from isoprobe.pipeline.prediction import prior_of
from isoprobe.pipeline.tokens import token_message, token_search_and_recommend
from isoprobe.pipeline.trials import TrialRunner
from isoprobe.protocol.messages import Facts
from isoprobe.report.batch_check import NOT_TRAINED, unclear_note
from isoprobe.report.cycle import describe as describe_cycle
from isoprobe.report.device import DeviceInfo
from isoprobe.report.edge import AllocatorComparison, TokenBudget
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.search.history import Borrowed
from isoprobe.spec.model import Spec
from isoprobe.spec.units import format_bytes
from isoprobe.system.slurm_job import signal_stop

#: The stops that leave an answer standing.
ANSWERED = (StopReason.EDGE_FOUND, StopReason.CAPPED)


@dataclass(frozen=True)
class Probed:
    """What the kinds found: the main search's answer, and each other kind's part where it ran."""

    found: Found
    tokens: TokenBudget | None = None
    comparison: AllocatorComparison | None = None
    evaluation: EvalEdge | None = None

    @property
    def interrupted(self) -> bool:
        return self.found.stop in (StopReason.INTERRUPTED, StopReason.TERMINATED)


def main_search(spec: Spec, target: Target, runner: TrialRunner, facts: Facts, borrowed: Borrowed | None) -> Probed:
    """The batch edge and its recommendation, or the token budget's (``search.unit: tokens``)."""
    if spec.search.unit == "tokens":
        tokens_found = token_search_and_recommend(spec, target, runner)
        return Probed(tokens_found.found, tokens=tokens_found.tokens)
    return Probed(search_and_recommend(spec, target, runner, prior_of(facts.estimate), borrowed))


def with_allocators(spec: Spec, target: Target, runner: TrialRunner, probed: Probed) -> Probed:
    """``allocators``: the edge under each other setting, after the first's (no new trial after a signal on CUDA)."""
    if not spec.allocators or (probed.interrupted and target.backend == "cuda"):
        return probed
    try:
        return replace(probed, comparison=compare_allocators(spec, target, runner, probed.found))
    except (KeyboardInterrupt, Terminated) as stopped:
        # The first setting's answer stands; the comparison is incomplete, and the exit code says so.
        return replace(probed, found=replace(probed.found, stop=stop_reason_of(stopped)))


def with_evaluation(spec: Spec, target: Target, runner: TrialRunner, probed: Probed) -> Probed:
    """An eval batch to search: its edge at the recommended training batch, once the training edge stands."""
    found = probed.found
    if not wants_eval_search(spec) or found.stop not in ANSWERED or found.max_fitting is None:
        return probed
    try:
        training = found.recommended or found.max_fitting
        return replace(probed, evaluation=eval_search(spec, target, runner, training, found.max_fitting))
    except (KeyboardInterrupt, Terminated) as stopped:
        # The training answer stands; the evaluation edge is unknown, and the exit code says so.
        return replace(probed, found=replace(found, stop=stop_reason_of(stopped)))


def command_refusal(probed: Probed, runner: TrialRunner) -> Probed:
    """A command's trial proved the script trains at another batch than it is given: no earlier credit stands."""
    if not any(t.error is not None and t.error.type == NOT_TRAINED for t in runner.trials):
        return probed
    voided = replace(probed.found, max_fitting=None, recommended=None, recommendation=None, short_max=None)
    return replace(probed, found=voided)


def stopped_by(stop: StopReason, when: str = "before an answer") -> tuple[str, str] | None:
    """A signal's stop: the message's start and end, the Slurm job's time limit named where that sent the SIGTERM
    (``system.slurm_job``: scontrol asked once, inside a job only); None for any other stop."""
    if stop not in (StopReason.INTERRUPTED, StopReason.TERMINATED):
        return None
    return signal_stop("SIGTERM" if stop is StopReason.TERMINATED else "SIGINT", when)


@dataclass(frozen=True)
class Verdict:
    """The probe's stop, its message and suggestions, and where the search was capped."""

    stop: StopReason
    message: str
    suggestions: list[str]
    limited_by: str | None
    max_cycle: str | None


def message(spec: Spec, target: Target, device: DeviceInfo, runner: TrialRunner, probed: Probed) -> Verdict:
    """The one message: the main search's explanation, then each kind's part (evaluation, tokens, a command's cycle
    and batch check)."""
    found = probed.found
    stop, max_fitting = found.stop, found.max_fitting
    capped_by = limited_by(spec, max_fitting, target.data, target.train_samples) if stop is StopReason.CAPPED else None
    training = [t for t in runner.trials if t.training_batch_size is None]  # the evaluation trials answer apart
    text, suggestions = explain(found, spec, device, training, capped_by, stopped_by(stop))
    evaluation = probed.evaluation
    if evaluation is not None and (failure := eval_failure(evaluation, runner.trials)) is not None:
        # The user's evaluation pass raised (crashed, hung): the probe's error (exit 4), not a memory verdict.
        stop = evaluation.stop
        text, suggestions = f"{text}; but {failure[0]}", failure[1]
    elif evaluation is not None:
        text += "; " + eval_summary(evaluation)
    if probed.tokens is not None:
        text = token_message(probed.tokens, text)
    max_cycle = cycle_at(runner, max_fitting)
    if max_cycle is not None:
        text += f"; at the maximum, {max_cycle}"
    unclear = [t for t in at_max(runner, max_fitting) if t.batch_check and t.batch_check.verdict == "unclear"]
    last_check = unclear[-1].batch_check if unclear else None
    if last_check is not None and max_fitting is not None and stop in ANSWERED:
        text += "; " + unclear_note(max_fitting, last_check)
    return Verdict(stop, text, suggestions, capped_by, max_cycle)


def at_max(runner: TrialRunner, max_fitting: int | None) -> list:
    """The training trials that ran the maximum and fit (the same question: length, allocator)."""
    if max_fitting is None:
        return []
    return [
        t
        for t in runner.same_question()
        if t.batch_size == max_fitting
        and t.outcome is Outcome.FITS
        and t.training_batch_size is None
        and t.purpose in ("search", "retry", "confirmation", "long_run")
    ]


def cycle_at(runner: TrialRunner, max_fitting: int | None) -> str | None:
    """What the maximum's deciding trial (the longest that fit there) saw of the script's cycle, in a sentence."""
    seen = [t for t in at_max(runner, max_fitting) if t.cycle is not None]
    if not seen:
        return None
    deciding = max(seen, key=lambda t: (t.cycle.evaluation_step is not None, t.cycle.steps))
    return describe_cycle(deciding.cycle, format_bytes=format_bytes)
