"""The one-sentence answer and what to try next, from what the search established. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from isoprobe.executors.srun_nodes import stop_context
from isoprobe.protocol.messages import RANK_LOST, DataScan
from isoprobe.report import steady
from isoprobe.report.device import DeviceInfo
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report.rank_progress import PRINTED_NOTHING, RANK_BEHIND, TIMED_OUT
from isoprobe.report.recommendation import Recommendation, Soak
from isoprobe.report.trial import Trial
from isoprobe.search.soak import RISE_FLOOR_BYTES, RISE_FRACTION
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
    #: Batches above the maximum whose deciding trial fit, but inside the spread (``search.margin``).
    marginal: tuple[int, ...] = ()


#: Command trials isoprobe refuses to credit, with what the user can do (``child.command_trial.verdicts``).
_REFUSALS = {
    "CommandBatchNotTrained": "let the script train at the batch it is given: turn its own batch-size finder off and "
    "pass {batch_size} to where its batches are built",
    "CommandForgedLines": "leave the folder in $ISOPROBE_SHIM_DIR to isoprobe: nothing in the command may write there",
}


def limited_by(
    spec: Spec, max_fitting: int | None, data: DataScan | None = None, train_samples: int | None = None
) -> str:
    """Which cap a capped search stopped at: the dataset, the spec's maximum, or the search's ceiling."""
    if (
        train_samples is not None
        and max_fitting == train_samples
        and (spec.search.max_batch_size is None or train_samples <= spec.search.max_batch_size)
    ):
        return "dataset_size"  # the hf_trainer's whole train set fits in one batch
    if (
        data is not None
        and max_fitting == data.samples
        and (spec.search.max_batch_size is None or data.samples <= spec.search.max_batch_size)
    ):
        return "dataset_size"  # the whole of the data section's dataset fits in one batch
    if (
        spec.search.dataset_size is not None
        and max_fitting == spec.search.dataset_size
        and (spec.search.max_batch_size is None or spec.search.dataset_size <= spec.search.max_batch_size)
    ):
        return "dataset_size"
    if spec.search.max_batch_size is not None and max_fitting == spec.search.max_batch_size:
        return "max_batch_size"
    return "search_ceiling"


def _batches(batches: tuple[int, ...]) -> str:
    return f"batch {batches[0]}" if len(batches) == 1 else "batches " + ", ".join(map(str, batches))


def cap_reason(spec: Spec, capped_by: str | None, max_fitting: int | None) -> str:
    """What bounded a capped search, in the words of the spec the user wrote (``limited_by``'s value is a key).

    ``dataset_size`` is also the cap a data section's dataset sets, where the user set no search.dataset_size:
    then it is the dataset's length that bounds the search, and the message says so."""
    search = spec.search
    if capped_by == "dataset_size":
        if search.dataset_size != max_fitting:
            where = "the dataset (data.dataset)" if spec.data is not None else "the Trainer's train_dataset"
            return f"{where} has {max_fitting} samples, and a batch cannot hold more"
        return f"search.dataset_size is {search.dataset_size}"
    if capped_by == "max_batch_size":
        return f"search.max_batch_size is {search.max_batch_size}"
    return f"the search never tries more than {max_fitting} samples"


def _save_memory(spec: Spec) -> list[str]:
    """What the spec could still turn on to need less memory: only the levers it does not use yet."""
    if spec.command is not None:  # the script's own options: isoprobe's sections do not reach into it
        return [
            "the script's own memory options, if it has them (mixed precision, gradient checkpointing, a "
            "lighter optimizer, shorter inputs), or a smaller model"
        ]
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


# --------------------------------------------------------------------------- a soak's failure, from its evidence

_GROWING = (
    "memory grows from step to step (recommendation.soaks, and the soak trials' step_budget_peak_bytes): look for "
    "what the step keeps between steps (tensors appended to a list, a loss kept with its graph, a cache "
    "that fills)"
)
_AT_FIRST_STEP = (
    "the soak ran out of memory before its first step ended, at a batch no larger than one the search's "
    "trials fit: the runs differ, not the steps (near the edge the same batch can fit in one process "
    "and not in the next: what else held memory then, the allocator's layout). Run the probe again, "
    "or ask more headroom (recommendation.headroom); the soak trial's error says what failed"
)
_NO_VERDICT = (
    "a soak ended without a verdict on memory (crashed or timed out, twice): see that trial's stderr_tail "
    "and signal (a SIGKILL can be the kernel's OOM killer)"
)


def soak_grew(soak: Soak, peaks: list[int]) -> bool:
    """Whether a soak's own per-step peaks show growth: still rising at its end, or risen since its first step's
    warm-up by more than noise (search.soak's floor). A soak that stopped before a second step shows none."""
    if soak.still_rising:
        return True
    if len(peaks) < 2:
        return False
    rise = peaks[-1] - peaks[1 if len(peaks) > 2 else 0]
    return rise > max(RISE_FLOOR_BYTES, RISE_FRACTION * peaks[-1])


def why_soak_failed(soak: Soak, peaks: list[int], steps: int, target_peak: int, fit: Trial | None) -> str:
    """What a soak that did not survive shows, in words: how far it got and what its peaks did there.

    ``peaks``: its trial's step_budget_peak_bytes (the capacity's units); ``fit``: the search's largest fitting
    trial at this batch or above (the evidence a failure at the first step is a run-to-run difference, not growth
    over steps)."""
    done = soak.steps_completed
    if soak.outcome is Outcome.OUT_OF_MEMORY and done == 0:
        where = (
            f", where batch {fit.batch_size} had fit {len(fit.step_seconds)} steps in trial {fit.index}"
            if fit is not None
            else ""
        )
        return f"ran out of memory at its first step (no step completed{where}): not growth over steps"
    if soak.outcome is Outcome.OUT_OF_MEMORY and not soak_grew(soak, peaks):
        return (
            f"ran out of memory at step {done + 1} of {steps} after its peak held at {format_bytes(peaks[-1])} "
            f"for {done} step{'s' if done > 1 else ''}: a jump at that step, not growth from step to step"
        )
    if soak.outcome is Outcome.OUT_OF_MEMORY:
        rate = (
            f", its peak rising {format_bytes(soak.growth_bytes_per_step)} a step"
            if soak.growth_bytes_per_step
            else ", its peak rising"
        )
        return f"ran out of memory after {done} of {steps} steps{rate}"
    growth = soak.growth_bytes_per_step or 0
    return (
        f"kept growing ({format_bytes(growth)} a step) above the {format_bytes(target_peak)} target peak "
        f"(projected {format_bytes(soak.projected_peak_bytes)} after {steps} steps)"
    )


def none_survived(soaks: list[Soak], trials: list[Trial]) -> tuple[str, list[str]]:
    """Why no soak survived, from their evidence, and what to try: growth only where a soak's peaks grew."""
    by_index = {t.index: t for t in trials}
    peaks = [
        (by_index[s.trial].step_budget_peak_bytes or by_index[s.trial].step_peak_bytes) if s.trial in by_index else []
        for s in soaks
    ]
    tried = "its soak" if len(soaks) == 1 else f"{len(soaks)} soaks"
    if any(soak_grew(s, p) for s, p in zip(soaks, peaks, strict=True)):
        return (
            f"no batch survived {tried}: memory grows from step to step whatever the batch (see the soak "
            "trials' step_budget_peak_bytes)",
            [_GROWING],
        )
    if all(s.outcome is Outcome.OUT_OF_MEMORY and s.steps_completed == 0 for s in soaks):
        each = "its soak" if len(soaks) == 1 else f"each of {len(soaks)} soaks"
        return (
            f"no batch survived {tried}: {each} ran out of memory at its first step, where the search's trials "
            "fit as large a batch: the runs differ, not the steps",
            [_AT_FIRST_STEP],
        )
    suggestions = [_NO_VERDICT] if any(s.outcome.meaning.retried for s in soaks) else []
    return (
        f"no batch survived {tried} (see each soak's outcome, steps_completed and its trial's step_budget_peak_bytes)",
        suggestions,
    )


def _with_recommendation(text: str, found: Found, trials: list[Trial]) -> tuple[str, list[str]]:
    """The answer's sentence with its recommendation, and what the soaks' own evidence suggests."""
    soaks = found.recommendation.soaks if found.recommendation else []
    if found.recommended:
        if soaks and soaks[-1].still_rising:
            return (
                f"{text}; recommended {found.recommended} (its peak was still rising at the end of its soak)",
                [_GROWING, "a longer soak (recommendation.soak_steps) shows how far it goes"],
            )
        return f"{text}; recommended {found.recommended}", []
    if soaks:
        return f"{text}; no batch is recommended: none survived its soak", none_survived(soaks, trials)[1]
    return text, []


def explain(
    found: Found,
    spec: Spec,
    info: DeviceInfo,
    trials: list[Trial],
    capped_by: str | None,
    stopped_by: tuple[str, str] | None = None,
) -> tuple[str, list[str]]:
    """The one-sentence answer and what to try next, from what the search established.

    ``stopped_by``: for a stop by a signal, the message's start and end as the caller found them
    (``system.slurm_job.signal_stop``: the Slurm job's time limit, where that sent the SIGTERM); by default the
    signal's name alone. Each stop reason's words are in a function of their own, below.
    """
    stop = found.stop
    where = _where(spec, info)
    last = _deciding_trial(stop, trials)
    if stop is StopReason.EDGE_FOUND:
        return _edge_found(found, spec, where, trials)
    if stop is StopReason.CAPPED:
        text = (
            f"batch {found.max_fitting} fits; larger batches were not tried: "
            f"{cap_reason(spec, capped_by, found.max_fitting)}"
        )
        return _with_recommendation(text, found, trials)
    if stop is StopReason.START_DOES_NOT_FIT:
        return _start_does_not_fit(spec, info, where)
    if stop is StopReason.ERROR and last is not None:
        return _errored(last, spec)
    if stop is StopReason.CRASHED and last is not None:
        return _crashed(last)
    if stop is StopReason.TIMED_OUT and last is not None:
        return _timed_out(last, spec)
    if stop is StopReason.STILL_RISING:
        return _still_rising(found, spec)
    best = f"; largest batch that fit so far: {found.max_fitting}" if found.max_fitting else ""
    seen = f"; {stop_context()}" if stop_context() else ""  # a node of the job Slurm lost, seen when the signal came
    start, end = stopped_by or (
        f"stopped by {'SIGTERM' if stop is StopReason.TERMINATED else 'SIGINT'} before an answer",
        "",
    )
    return f"{start}{best}{seen}{end}", []


def _where(spec: Spec, info: DeviceInfo) -> str:
    """The device as the sentence names it; for a gang, per rank, since its batches are per rank (people read only
    the one sentence)."""
    if spec.distributed.gang:
        return (
            f"{info.backend} ({format_bytes(info.capacity_bytes)} per rank, {spec.distributed.strategy} over "
            f"{spec.distributed.world_size or 1} ranks; batches per rank)"
        )
    return f"{info.backend} ({format_bytes(info.capacity_bytes)})"


def _deciding_trial(stop: StopReason, trials: list[Trial]) -> Trial | None:
    """The trial that decided a failed search: the last one whose outcome leads to the stop the search made
    (``Meaning.stop``: after a crash, a retry may have fit, and the message is about the crash), else the last."""
    return next((t for t in reversed(trials) if t.outcome.meaning.stop is stop), trials[-1] if trials else None)


def _edge_found(found: Found, spec: Spec, where: str, trials: list[Trial]) -> tuple[str, list[str]]:
    """An edge: the maximum, how the batch above it failed (in its outcome's declared words), and what else the
    search saw near it (flaky batches, a short maximum the long run did not hold, marginal batches)."""
    if found.first_failing is None:  # only marginal batches above the maximum
        text = (
            f"batch {found.max_fitting} fits on {where}; {_batches(found.marginal)} fit only inside the spread "
            "(their peaks left less free memory than a long run's peak moves between runs and over steps: see "
            "edge_margin), and no larger batch was tried"
        )
        return _with_recommendation(text, found, trials)
    outcome = found.first_failing_outcome
    how = outcome.meaning.prose if outcome is not None else "fails"
    text = f"batch {found.max_fitting} fits and {found.first_failing} {how} on {where}"
    if found.flaky:
        text += f"; flaky batches (fit in one run, failed in another): {list(found.flaky)}"
    if found.short_max is not None:
        text += (
            f"; both in the long run (trials that step until the peak is steady): {found.short_max} fit "
            f"{spec.search.steps} steps but its peak kept rising after them"
        )
    if found.marginal:
        text += (
            f"; {_batches(found.marginal)} fit too, but with less free memory than a long "
            "run's peak moves between runs and over steps (the spread: see edge_margin), so not as the "
            "maximum"
        )
    return _with_recommendation(text, found, trials)


def _start_does_not_fit(spec: Spec, info: DeviceInfo, where: str) -> tuple[str, list[str]]:
    """Not even the start batch fits: the levers the spec does not use yet, a smaller start, a larger CPU budget."""
    suggestions = _save_memory(spec)
    if info.backend == "cpu":
        suggestions.insert(0, "a larger memory_budget (--memory-budget) for the CPU backend")
    if spec.search.start_batch_size > 2:
        suggestions.insert(0, "a smaller search.start_batch_size")
    return f"not even the start batch {spec.search.start_batch_size} fits on {where}", suggestions


def _errored(last: Trial, spec: Spec) -> tuple[str, list[str]]:
    """An error stopped the search: a bug in the model or the script, or a command trial isoprobe refused to credit
    (issue 47); never a memory verdict, and the words say so."""
    error = last.error
    detail = f"{error.type}: {error.message.splitlines()[0] if error.message else ''}" if error else "an error"
    if spec.command is not None and error is not None and error.type in _REFUSALS:
        # Not the script's crash: isoprobe refuses to credit what it read (issue 47); the message says why.
        return f"batch {last.batch_size}: {error.message}", [_REFUSALS[error.type]]
    if spec.command is not None:
        return (
            f"batch {last.batch_size}: the command failed with {detail} — the script's error, not a memory verdict",
            ["fix what trials[-1].error.traceback_tail shows (the command's own last lines), then run again"],
        )
    return (
        f"batch {last.batch_size} raised {detail} — an error in the model or spec, not a memory verdict",
        ["fix the error shown in trials[-1].error.traceback_tail, then run again"],
    )


def _crashed(last: Trial) -> tuple[str, list[str]]:
    """A crash that persisted over its retries: a rejected 'fits', a command's rank lost to a signal, or a process
    killed or gone without a result; each points at where its evidence is."""
    if last.reclassified:
        return (
            f"batch {last.batch_size} crashed: its 'fits' was rejected ({last.reclassified})",
            ["see trials[-1].reclassified: the child's verdict contradicts what it was asked or measured"],
        )
    if last.error is not None and last.error.type == RANK_LOST:  # a command's rank lost to a signal
        return (
            f"batch {last.batch_size} crashed: {last.error.message}",
            [
                "a rank killed by SIGKILL with no error of its own is often the kernel's OOM killer (dmesg, the "
                "job's memory limit) or a kill from outside; see trials[-1].stderr_tail for the launcher's "
                "report"
            ],
        )
    how = f"killed by {last.signal}" if last.signal else f"exited with status {last.exit_code} without a result"
    return (
        f"batch {last.batch_size} crashed ({how}, last phase: {last.phase})",
        ["see trials[-1].stderr_tail; a SIGKILL can be the kernel's OOM killer"],
    )


def _timed_out(last: Trial, spec: Spec) -> tuple[str, list[str]]:
    """A timeout that persisted: on a busy node it says nothing about the batch; a command's, what its supervisor
    saw (``_command_timed_out``); else the timeout itself."""
    if last.busy_at_timeout:
        return (
            f"batch {last.batch_size} ran past its timeout on a busy node: its processes waited for a CPU more "
            f"than half the time they wanted one, after {last.busy_seconds or 0:g} s were added to the "
            f"{spec.search.trial_timeout:g} s trial timeout for it; that says nothing about the batch"
            + (
                f" (its command had come to this: {last.error.message})"
                if last.error is not None and last.error.type in (TIMED_OUT, RANK_BEHIND)
                else ""
            ),
            [
                "run it where the cores are free (a Slurm job's own CPUs: --exclusive or --cpus-per-task), or raise "
                "search.trial_timeout"
            ],
        )
    if spec.command is not None:
        return _command_timed_out(last, spec)
    return (
        f"batch {last.batch_size} ran past the {spec.search.trial_timeout:g} s trial timeout",
        ["raise search.trial_timeout, or lower search.steps"],
    )


def _still_rising(found: Found, spec: Spec) -> tuple[str, list[str]]:
    """No batch holds the long run: every batch fit only inside the spread (too little room, issue 35), or each
    one's peak kept rising (growth: a leak?)."""
    if found.first_failing is None and found.marginal:
        # Down to batch 1 every batch fit, but inside the spread: not growth, too little room (issue 35).
        return (
            f"no batch leaves more than the spread free: {_batches(found.marginal)} fit, each with less free memory "
            "than a long run's peak moves between runs and over steps (see edge_margin)",
            ["raise the memory budget, or lower search.edge_spread if your runs vary less (0 turns the rule off)"],
        )
    return (
        f"no batch holds the long run: down to batch {found.first_failing}, every trial's peak kept rising until "
        f"it ran out of memory or reached {spec.search.steady_steps or steady.DEFAULT_MAX_STEPS} steps "
        f"(a leak?); {found.short_max} fit {spec.search.steps} steps",
        [
            "look for memory kept from step to step (tensors appended to a list, a loss kept with its graph)",
            "see trials[].step_budget_peak_bytes: the peak after every step",
        ],
    )


def _command_timed_out(last: Trial, spec: Spec) -> tuple[str, list[str]]:
    """A command trial killed at its timeout: what its supervisor had seen (``report.rank_progress``: the rank
    behind, its steps, the command's last lines), where it wrote it; else the steps every rank made. The cause that
    the script's optimizer is not torch's only where no process stepped (issue 56: rank 0 stepping alone while
    rank 1 hung was blamed on it), and "printed nothing" only where the command's own output was read empty."""
    timeout = f"{spec.search.trial_timeout:g} s trial timeout"
    stepped = max(len(last.step_seconds), len(last.step_budget_peak_bytes), len(last.step_peak_bytes))
    seen = last.error if last.error is not None and last.error.type in (TIMED_OUT, RANK_BEHIND) else None
    slow = (
        "a step takes longer than the timeout allows, or the ranks wait for each other (a collective none "
        "completes); raise search.trial_timeout, or lower search.steps"
    )
    not_torch = (
        "the shim counts steps of torch.optim.Optimizer (and subclasses): a script whose optimizer is not "
        "one (a hand-written update, another library's) shows no step; or its set-up takes longer than "
        "the timeout: raise search.trial_timeout"
    )
    if seen is None:  # the supervisor wrote nothing of what it saw: the steps every rank made are all there is
        printed = ["see trials[-1].stderr_tail"] if (last.stderr_tail or "").strip() else []
        if stepped:
            return f"batch {last.batch_size} ran past the {timeout} after {stepped} optimizer step(s) were seen", [
                slow,
                *printed,
            ]
        return f"batch {last.batch_size}: no optimizer step seen within the {timeout}", [not_torch, *printed]
    lines = (
        []
        if PRINTED_NOTHING in seen.message
        else ["the command's last lines, stderr and stdout: trials[-1].error.traceback_tail"]
    )
    if seen.type == RANK_BEHIND or stepped or last.command_ranks:
        hint = (
            (
                "find what the rank behind waits for (a data loader, a file, a barrier only some ranks reach), or "
                "raise search.trial_timeout if it is only slower"
            )
            if seen.type == RANK_BEHIND
            else slow
        )
        return f"batch {last.batch_size} ran past the {timeout}: {seen.message}", [hint, *lines]
    return f"batch {last.batch_size}: no optimizer step seen within the {timeout}: {seen.message}", [not_torch, *lines]
