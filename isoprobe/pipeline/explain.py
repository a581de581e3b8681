"""The one-sentence answer and what to try next, from what the search established. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from isoprobe.protocol.messages import DataScan
from isoprobe.report import steady
from isoprobe.report.outcomes import Outcome
from isoprobe.report.result import DeviceInfo, Recommendation, StopReason, Trial
from isoprobe.spec.model import Spec
from isoprobe.spec.units import format_bytes


@dataclass(frozen=True)
class Found:
    """What the search and the recommendation established."""

    stop: StopReason
    max_fitting: int | None
    first_failing: int | None
    first_failing_outcome: Outcome | None = None
    flaky: tuple[int, ...] = ()
    recommended: int | None = None
    recommendation: Recommendation | None = None
    #: Set when the short trials' maximum did not hold in the long run: that maximum (the answer is below it).
    short_max: int | None = None


def limited_by(spec: Spec, max_fitting: int | None, data: DataScan | None = None) -> str:
    """Which cap a capped search stopped at: the dataset, the spec's maximum, or the search's ceiling."""
    if data is not None and max_fitting == data.samples and (
        spec.search.max_batch_size is None or data.samples <= spec.search.max_batch_size
    ):
        return "dataset_size"  # the whole of the data section's dataset fits in one batch
    if spec.search.dataset_size is not None and max_fitting == spec.search.dataset_size and (
        spec.search.max_batch_size is None or spec.search.dataset_size <= spec.search.max_batch_size
    ):
        return "dataset_size"
    if spec.search.max_batch_size is not None and max_fitting == spec.search.max_batch_size:
        return "max_batch_size"
    return "search_ceiling"


def cap_reason(spec: Spec, capped_by: str | None, max_fitting: int | None) -> str:
    """What bounded a capped search, in the words of the spec the user wrote (``limited_by``'s value is a key).

    ``dataset_size`` is also the cap a data section's dataset sets, where the user set no search.dataset_size:
    then it is the dataset's length that bounds the search, and the message says so."""
    search = spec.search
    if capped_by == "dataset_size":
        if spec.data is not None and search.dataset_size != max_fitting:
            return f"the dataset (data.dataset) has {max_fitting} samples, and a batch cannot hold more"
        return f"search.dataset_size is {search.dataset_size}"
    if capped_by == "max_batch_size":
        return f"search.max_batch_size is {search.max_batch_size}"
    return f"the search never tries more than {max_fitting} samples"


def _save_memory(spec: Spec) -> list[str]:
    """What the spec could still turn on to need less memory: only the levers it does not use yet."""
    training = spec.training
    levers = []
    if training.precision == "fp32":
        levers.append("training.precision: bf16-mixed (or fp16-mixed) shrinks activations")
    if not training.gradient_checkpointing and training.mode == "train":
        levers.append("training.gradient_checkpointing: true trades recomputation for activation memory")
    if spec.optimizer.name != "sgd" and training.mode == "train":
        levers.append("optimizer sgd keeps less state than adam/adamw (none without momentum)")
    levers.append("a smaller per-sample input (shorter sequences, smaller images) or a smaller model")
    return levers


def _with_recommendation(text: str, found: Found) -> tuple[str, list[str]]:
    """The answer's sentence with its recommendation, and what a soak that saw growth suggests."""
    soaks = found.recommendation.soaks if found.recommendation else []
    growing = ("memory grows from step to step (recommendation.soaks, and the soak trials' step_peak_bytes): "
               "look for what the step keeps between steps (tensors appended to a list, a loss kept with its "
               "graph, a cache that fills)")
    if found.recommended:
        if soaks and soaks[-1].still_rising:
            return (f"{text}; recommended {found.recommended} (its peak was still rising at the end of its soak)",
                    [growing, "a longer soak (recommendation.soak_steps) shows how far it goes"])
        return f"{text}; recommended {found.recommended}", []
    if soaks:
        return f"{text}; no batch is recommended: none survived its soak", [growing]
    return text, []


def explain(found: Found, spec: Spec, info: DeviceInfo, trials: list[Trial], capped_by: str | None):
    """The one-sentence answer and what to try next, from what the search established."""
    stop, max_fitting, first_failing, recommended = found.stop, found.max_fitting, found.first_failing, found.recommended
    where = f"{info.backend} ({format_bytes(info.capacity_bytes)})"
    if spec.distributed.gang:  # the batches are per rank: say so in the one sentence people read
        where = (f"{info.backend} ({format_bytes(info.capacity_bytes)} per rank, {spec.distributed.strategy} over "
                 f"{spec.distributed.world_size or 1} ranks; batches per rank)")
    # The trial that decided a failed search: the last one that ended as the search did (after a crash, a
    # retry may have fit; the message is about the crash), else simply the last.
    last = next((t for t in reversed(trials) if t.outcome.value == stop.value), trials[-1] if trials else None)
    if stop is StopReason.EDGE_FOUND:
        if found.first_failing_outcome is Outcome.OUT_OF_MEMORY:
            how = "runs out of memory"
        elif found.first_failing_outcome is Outcome.STILL_RISING:
            how = "is still rising at the step cap (search.steady_steps)"
        else:
            how = f"{found.first_failing_outcome.value} (counted as failing; not proven to be memory)"
        text = f"batch {max_fitting} fits and {first_failing} {how} on {where}"
        if found.flaky:
            text += f"; flaky batches (fit in one run, failed in another): {list(found.flaky)}"
        if found.short_max is not None:
            text += (f"; both in the long run (trials that step until the peak is steady): {found.short_max} fit "
                     f"{spec.search.steps} steps but its peak kept rising after them")
        return _with_recommendation(text, found)
    if stop is StopReason.CAPPED:
        text = f"batch {max_fitting} fits; larger batches were not tried: {cap_reason(spec, capped_by, max_fitting)}"
        return _with_recommendation(text, found)
    if stop is StopReason.START_DOES_NOT_FIT:
        suggestions = _save_memory(spec)
        if info.backend == "cpu":
            suggestions.insert(0, "a larger memory_budget (--memory-budget) for the CPU backend")
        if spec.search.start_batch_size > 2:
            suggestions.insert(0, "a smaller search.start_batch_size")
        return f"not even the start batch {spec.search.start_batch_size} fits on {where}", suggestions
    if stop is StopReason.ERROR and last is not None:
        error = last.error
        detail = f"{error.type}: {error.message.splitlines()[0] if error.message else ''}" if error else "an error"
        return (
            f"batch {last.batch_size} raised {detail} — an error in the model or spec, not a memory verdict",
            ["fix the error shown in trials[-1].error.traceback_tail, then run again"],
        )
    if stop is StopReason.CRASHED and last is not None:
        if last.reclassified:
            return (
                f"batch {last.batch_size} crashed: its 'fits' was rejected ({last.reclassified})",
                ["see trials[-1].reclassified: the child's verdict contradicts what it was asked or measured"],
            )
        how = f"killed by {last.signal}" if last.signal else f"exited with status {last.exit_code} without a result"
        return (
            f"batch {last.batch_size} crashed ({how}, last phase: {last.phase})",
            ["see trials[-1].stderr_tail; a SIGKILL can be the kernel's OOM killer"],
        )
    if stop is StopReason.TIMED_OUT and last is not None:
        return (
            f"batch {last.batch_size} ran past the {spec.search.trial_timeout:g} s trial timeout",
            ["raise search.trial_timeout, or lower search.steps"],
        )
    if stop is StopReason.STILL_RISING:
        return (
            f"no batch holds the long run: down to batch {first_failing}, every trial's peak kept rising until "
            f"it ran out of memory or reached {spec.search.steady_steps or steady.DEFAULT_MAX_STEPS} steps "
            f"(a leak?); {found.short_max} fit {spec.search.steps} steps",
            ["look for memory kept from step to step (tensors appended to a list, a loss kept with its graph)",
             "see trials[].step_budget_peak_bytes: the peak after every step"],
        )
    best = f"; largest batch that fit so far: {max_fitting}" if max_fitting else ""
    return f"stopped by {'SIGTERM' if stop is StopReason.TERMINATED else 'SIGINT'} before an answer{best}", []
