"""The edge search over real trials, the recommendation, and the allocator comparison.

Each function drives the pure search (``isoprobe.search``) with a
``TrialRunner`` as its oracle and turns the conclusion into a ``Found``.
"""

from __future__ import annotations

from dataclasses import replace

from isoprobe.errors import Terminated
from isoprobe.insights import throughput
from isoprobe.outcomes import Outcome, StopReason
from isoprobe.probe.environment import Target
from isoprobe.probe.explain import Found
from isoprobe.probe.trials import TrialRunner
from isoprobe.recommend import advise
from isoprobe.result import AllocatorComparison, AllocatorOutcome, MemoryModel, Recommendation, Trial
from isoprobe.search import Conclusion, Limits, Observation, doubling_step, guided_step, progress, run_search
from isoprobe.spec import Spec


def _limits(spec: Spec, target: Target, start: int | None = None) -> Limits:
    return Limits(
        start=start or spec.search.start_batch_size,
        cap=spec.search.cap,
        retries=spec.search.retries,
        confirmations=spec.search.confirmations,
        capacity=target.search_capacity,
    )


def _found(conclusion: Conclusion) -> Found:
    return Found(conclusion.stop, conclusion.max_fitting, conclusion.first_failing,
                 conclusion.first_failing_outcome, conclusion.flaky)


def edge_search(spec: Spec, target: Target, runner: TrialRunner, start: int | None) -> Found:
    """The edge search alone (no recommendation), from ``start`` or the spec's start batch."""
    step = guided_step if spec.search.strategy == "guided" else doubling_step
    return _found(run_search(runner.observe, _limits(spec, target, start), [], step=step))


def search_and_recommend(spec: Spec, target: Target, runner: TrialRunner) -> Found:
    """The edge search over real trials, then the recommendation; an interrupt keeps the trials so far."""
    limits = _limits(spec, target)
    step = guided_step if spec.search.strategy == "guided" else doubling_step
    history: list[Observation] = []
    try:
        conclusion = run_search(runner.observe, limits, history, step=step)
        found = _found(conclusion)
        if not conclusion.exact:
            return found
        recommended, recommendation = _recommend(spec, target, runner, found.max_fitting, found.first_failing)
        if spec.recommendation.objective == "throughput" and recommended is not None:
            recommended, recommendation = _prefer_throughput(spec, runner.trials, recommended, recommendation)
        return replace(found, recommended=recommended, recommendation=recommendation)
    except (KeyboardInterrupt, Terminated) as stopped:
        known = progress(history, limits)
        return Found(stop_reason_of(stopped), known.max_fitting, known.first_failing, known.first_failing_outcome,
                     known.flaky)


def stop_reason_of(stopped: BaseException) -> StopReason:
    return StopReason.INTERRUPTED if isinstance(stopped, KeyboardInterrupt) else StopReason.TERMINATED


def _recommend(spec: Spec, target: Target, runner: TrialRunner, max_fitting: int, first_failing: int | None):
    """Advise from the fitting trials, then run the advised batch unless it already ran and fit."""
    under_budget = [t for t in runner.trials if t.purpose != "memory_check"]
    fitting = [(t.batch_size, t.peak_bytes) for t in under_budget if t.outcome is Outcome.FITS and t.peak_bytes]
    advice = advise(
        max_fitting,
        fitting,
        target.info.capacity_bytes,
        spec.recommendation.headroom,
        spec.recommendation.multiple_of,
        first_failing,
    )
    batch, note = advice.batch_size, advice.note
    measured = next((t for t in under_budget if t.batch_size == batch and t.outcome is Outcome.FITS), None)
    if measured is None:
        check = runner.run(batch, purpose="recommendation_check")
        if check.outcome is Outcome.FITS:
            measured = check
        else:
            lower = [t for t in runner.trials
                     if t.purpose != "memory_check" and t.outcome is Outcome.FITS and t.batch_size <= batch]
            measured = max(lower, key=lambda t: t.batch_size) if lower else None
            note += f"; the check run of {batch} ended {check.outcome.value}, so the recommendation fell back"
            batch = measured.batch_size if measured else None
    model = advice.line
    return batch, Recommendation(
        capacity_bytes=advice.capacity_bytes,
        headroom_bytes=advice.headroom_bytes,
        target_peak_bytes=advice.target_peak_bytes,
        memory_model=MemoryModel(intercept_bytes=model.intercept, per_sample_bytes=model.slope, points=model.points)
        if model else None,
        multiple_of=spec.recommendation.multiple_of,
        predicted_peak_bytes=advice.predicted_peak_bytes,
        measured_peak_bytes=measured.peak_bytes if measured else None,
        note=note,
    )


def _prefer_throughput(spec: Spec, trials: list[Trial], recommended: int, recommendation: Recommendation):
    """objective: throughput: the smallest tested batch within the headroom that is about as fast as the best."""
    within = [t for t in trials if t.batch_size <= recommended]
    curve = throughput(within, spec.recommendation.throughput_tolerance)
    if curve is None or curve.fastest_batch_size >= recommended:
        return recommended, recommendation
    fastest = curve.fastest_batch_size
    note = (f"{recommendation.note}; objective throughput: {fastest} runs within "
            f"{spec.recommendation.throughput_tolerance:.0%} of the best samples/s measured up to {recommended}")
    measured = max((t.peak_bytes for t in trials if t.batch_size == fastest and t.peak_bytes), default=None)
    return fastest, recommendation.model_copy(update={"note": note, "measured_peak_bytes": measured})


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
    outcomes = [_allocator_outcome(spec.allocators[0], first, runner)]
    start = first.max_fitting
    for setting in spec.allocators[1:]:
        runner.use_allocator(setting)
        runner.reporter.note(f"allocator {setting!r}: searching from batch {start or spec.search.start_batch_size}")
        found = edge_search(spec, target, runner, start=start)
        if found.stop is StopReason.START_DOES_NOT_FIT and start and start > spec.search.start_batch_size:
            found = edge_search(spec, target, runner, start=None)
        outcomes.append(_allocator_outcome(setting, found, runner))
        if found.max_fitting:
            start = max(start or 0, found.max_fitting)
    ranked = [o for o in outcomes if o.max_batch_size is not None]
    best = max(ranked, key=lambda o: o.max_batch_size).setting if ranked else None
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
