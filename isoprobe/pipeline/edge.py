"""The edge search over real trials, then the recommendation (``pipeline.recommendation``), and the allocator
comparison.

Each function drives the pure search (``isoprobe.search.edge_search``) with a
``TrialRunner`` as its oracle and turns the conclusion into a ``Found``.
"""

from __future__ import annotations

from dataclasses import replace

from isoprobe.errors import Terminated
from isoprobe.pipeline.data import data_cap
from isoprobe.pipeline.environment import Target
from isoprobe.pipeline.explain import Found
from isoprobe.pipeline.recommendation import recommend
from isoprobe.pipeline.steady_edge import long_run_search
from isoprobe.pipeline.trials import TrialRunner
from isoprobe.report.edge import AllocatorComparison, AllocatorOutcome
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.search.edge_search import Conclusion, progress, run_search
from isoprobe.search.history import Borrowed, Limits, Observation, Prior
from isoprobe.search.steps import doubling_step, guided_step
from isoprobe.spec.model import Spec


def _limits(
    spec: Spec,
    target: Target,
    start: int | None = None,
    prior: Prior | None = None,
    borrowed: Borrowed | None = None,
    runner: TrialRunner | None = None,
) -> Limits:
    steady = runner is not None and runner.steady_rule is not None
    least = runner.spread(least=True) if runner is not None and steady else None
    return Limits(
        start=start or spec.search.start_batch_size,
        cap=data_cap(spec.search.cap, target.data, target.train_samples),
        retries=spec.search.retries,
        confirmations=spec.search.confirmations_for("batch"),
        capacity=target.search_capacity,
        # The traced estimate guides the guided search only; the classic doubling is kept as it is.
        prior=prior if spec.search.strategy == "guided" else None,
        borrowed=borrowed,
        steady=steady,  # the runner's steady rule: the trial that would be the maximum steps until steady
        margin=least.bytes if least is not None else 0,  # the first trial goes above what the spread lets through
    )


def _found(conclusion: Conclusion) -> Found:
    return Found(
        conclusion.stop,
        conclusion.max_fitting,
        conclusion.first_failing,
        conclusion.first_failing_outcome,
        conclusion.flaky,
    )


def edge_search(spec: Spec, target: Target, runner: TrialRunner, start: int | None) -> Found:
    """The edge search alone (no recommendation), from ``start`` or the spec's start batch."""
    step = guided_step if spec.search.strategy == "guided" else doubling_step
    limits = _limits(spec, target, start, runner=runner)
    return _long_run(runner, limits, run_search(runner.observe, limits, [], step=step))


def _long_run(runner: TrialRunner, limits: Limits, conclusion: Conclusion) -> Found:
    """The search's answer; where its maximum failed in the long run, the steady edge below it."""
    if conclusion.long_run_failure is None:
        return _found(conclusion)
    return long_run_search(runner, limits, conclusion)


def search_and_recommend(
    spec: Spec, target: Target, runner: TrialRunner, prior: Prior | None = None, borrowed: Borrowed | None = None
) -> Found:
    """The edge search over real trials, then the recommendation; an interrupt keeps the trials so far.

    ``prior``: the traced estimate's line (``prediction.prior_of``): the first trial goes near its edge.
    The allocator comparison's later searches start from the edge found instead.
    ``borrowed``: bounds another point of a frontier proved (``search.frontier_bounds``): they narrow where the
    search looks; the answer is still proven by this point's own trials.
    """
    limits = _limits(spec, target, prior=prior, borrowed=borrowed, runner=runner)
    step = guided_step if spec.search.strategy == "guided" else doubling_step
    history: list[Observation] = []
    try:
        from isoprobe.pipeline.parallel import search  # search.parallel: rounds of trials, one per slot

        conclusion = search(runner, limits, history, step)
        found = _long_run(runner, limits, conclusion)
        if found.stop not in (StopReason.EDGE_FOUND, StopReason.CAPPED):
            return found
        recommended, recommendation = recommend(spec, target, runner, edge_of(found))
        if any(t.purpose in ("soak", "recommendation_check") and t.outcome is Outcome.ERROR for t in runner.trials):
            # The user's code raised an error that is not about memory in a step the search's shorter trials did
            # not reach: a bug, not growth, so the probe stops as a search trial's error stops it (exit 4).
            return replace(found, stop=StopReason.ERROR, recommendation=recommendation)
        return replace(found, recommended=recommended, recommendation=recommendation)
    except (KeyboardInterrupt, Terminated) as stopped:
        known = progress(history, limits)
        return Found(
            stop_reason_of(stopped), known.max_fitting, known.first_failing, known.first_failing_outcome, known.flaky
        )


def edge_of(found: Found) -> int:
    """The largest batch that fit, of an answer that found its edge or stopped at the cap: the batch the
    recommendation starts from. Both stops are concluded only once a batch fit, so it is never None there."""
    if found.max_fitting is None:
        raise ValueError(f"a search that stopped with {found.stop.value} has no batch that fit to recommend from")
    return found.max_fitting


def stop_reason_of(stopped: BaseException) -> StopReason:
    return StopReason.INTERRUPTED if isinstance(stopped, KeyboardInterrupt) else StopReason.TERMINATED


def compare_allocators(spec: Spec, target: Target, runner: TrialRunner, first: Found) -> AllocatorComparison:
    """The edge under each further allocator setting, starting where the previous setting's edge was.

    The first setting's search already ran (``first``). Each next one starts at
    the largest batch that fit so far: allocator settings move the edge by a
    few samples, so the guided search confirms or corrects it in a few trials.
    If that start does not fit under the new setting, the search runs again
    from the spec's start, so the answer is exact either way. On the CPU
    backend nothing runs: PYTORCH_CUDA_ALLOC_CONF does not touch CPU memory.
    """
    if target.backend != "cuda":
        return AllocatorComparison(
            applies=False,
            note="the CPU backend does not use the CUDA caching allocator: the settings cannot change what "
            "fits, so the edge was searched once, with none of them",
        )
    allocators = spec.allocators
    if not allocators:  # with_allocators compares only a spec that names them
        raise ValueError("an allocator comparison needs the spec's allocators")
    outcomes = [_allocator_outcome(allocators[0], first, runner)]
    start = first.max_fitting
    for setting in allocators[1:]:
        runner.use_allocator(setting)
        runner.reporter.note(f"allocator {setting!r}: searching from batch {start or spec.search.start_batch_size}")
        found = edge_search(spec, target, runner, start=start)
        if found.stop is StopReason.START_DOES_NOT_FIT and start and start > spec.search.start_batch_size:
            found = edge_search(spec, target, runner, start=None)
        outcomes.append(_allocator_outcome(setting, found, runner))
        if found.max_fitting:
            start = max(start or 0, found.max_fitting)
    ranked = [(o.max_batch_size, o.setting) for o in outcomes if o.max_batch_size is not None]
    best = max(ranked, key=lambda r: r[0])[1] if ranked else None  # the first listed among equals
    return AllocatorComparison(
        applies=True,
        outcomes=outcomes,
        best=best,
        note="each setting searched in fresh processes; later ones started from the largest batch that fit so far",
    )


def _allocator_outcome(setting: str, found: Found, runner: TrialRunner) -> AllocatorOutcome:
    return AllocatorOutcome(
        setting=setting,
        max_batch_size=found.max_fitting,
        first_failing_batch_size=found.first_failing,
        stop_reason=found.stop.value,
        trials=sum(1 for t in runner.trials if t.allocator == setting),
    )
