"""The probe: spec -> environment check -> search over real trials -> recommendation -> Result.

This is where the pure parts (search, recommend, explain) meet the executor.
It never imports torch and never starts a process itself: the environment
check and every trial go through one ``Executor`` (``isoprobe.executors``),
the local one by default, a scripted one in unit tests.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import replace
from pathlib import Path

from isoprobe import __version__
from isoprobe.errors import Terminated
from isoprobe.executors import Executor
from isoprobe.executors.processes import memory_environment
from isoprobe.pipeline.command_ahead import command_plan
from isoprobe.pipeline.data import data_info
from isoprobe.pipeline.edge import compare_allocators, search_and_recommend, stop_reason_of
from isoprobe.pipeline.environment import (
    DEFAULT_CPU_BUDGET,
    allocator_info,
    inspect_environment,
    likely_backend,
    model_imports_note,
    resolve_target,
    trial_conditions,
)
from isoprobe.pipeline.eval_edge import eval_failure, eval_search, eval_summary, wants_eval_search
from isoprobe.pipeline.explain import Found, explain, limited_by
from isoprobe.pipeline.prediction import no_estimate, predicted_max, prediction, prior_of
from isoprobe.pipeline.tokens import token_message, token_search_and_recommend
from isoprobe.pipeline.trials import TrialRunner
from isoprobe.report.batch_check import NOT_TRAINED, unclear_note
from isoprobe.report.cycle import describe as describe_cycle
from isoprobe.report.device import AllocatorInfo, DistributedInfo
from isoprobe.report.edge import EdgeMargin, MarginalBatch
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report.output import Reporter
from isoprobe.report.result import Result
from isoprobe.search.history import Borrowed
from isoprobe.search.insights import memory_breakdown, throughput
from isoprobe.search.plan import accumulation_plan, micro_batch_ceiling
from isoprobe.spec.model import Spec
from isoprobe.spec.units import format_bytes
from isoprobe.system.slurm_job import signal_stop
from isoprobe.system.stops import settle


def local_executor(spec: Spec) -> Executor:
    """The default: isolated child processes on this machine, forked from a server or spawned (warm or not);
    with ``spec.distributed``, each trial a gang of them."""
    from isoprobe.executors.local import LocalExecutor
    from isoprobe.pipeline.command_ahead import starts_ahead

    forked = {None: ("cpu",), True: ("cpu", "cuda"), False: ()}[spec.search.fork_server]
    if starts_ahead(spec):
        forked = ()  # each trial's process is started ahead, and starts its command ahead (command_ahead)
    local = LocalExecutor(warm=spec.search.warm_start, fork=forked)
    if not spec.distributed.gang:
        return local
    if spec.distributed.launcher == "srun":
        import os

        from isoprobe.executors.srun_gang import SrunGangExecutor
        from isoprobe.executors.srun_plan import Allocation

        return SrunGangExecutor(
            LocalExecutor(warm=False),
            nodes=Allocation.from_environment(os.environ).nodes,
            ahead=spec.distributed.steps_ahead,
            world=spec.distributed.world_size,
        )
    from isoprobe.executors.gang import GangExecutor

    return GangExecutor(local)


def run_probe(
    spec: Spec,
    spec_path: str,
    reporter: Reporter,
    *,
    budget_source: str = "spec",
    environ: dict[str, str] | None = None,
    executor: Executor | None = None,
    world_size_source: str = "spec",
    borrowed: Borrowed | None = None,
) -> Result:
    """Everything ``isoprobe run`` does between a valid spec and the printed result.

    ``executor`` runs the environment check and the trials (default: the local
    one); it is closed before this returns, so nothing it started outlives the probe. ``borrowed``: bounds
    another frontier point proved, which only narrow where the search looks (``search.frontier_bounds``).
    """
    environ = dict(os.environ if environ is None else environ)
    started = time.monotonic()
    python_path = [str(Path(spec_path).resolve().parent)]
    executor = executor if executor is not None else local_executor(spec)
    try:
        built = (
            "builds model.hf_trainer's Trainer once, without training it"
            if spec.model.hf_trainer is not None
            else "reads the devices; the command itself runs in each trial"
            if spec.command is not None
            else "builds the model on the meta device"
        )
        reporter.note(f"checking the environment (a child process imports torch and {built})")
        try:
            # The first trial's process imports torch while the inspect child does the same. Inside
            # this try: a signal held while the spare starts lands as it ends, and must still give a
            # JSON document (found by test_interrupt with warm start on: 1 run in the full suite).
            backend = likely_backend(spec)
            executor.prestart(
                replace(
                    trial_conditions(spec, backend, spec.memory_budget or DEFAULT_CPU_BUDGET),
                    command_plan=command_plan(spec, backend, None, None),
                )
            )
            facts = inspect_environment(spec, spec_path, executor, python_path)
        except (KeyboardInterrupt, Terminated) as stopped:
            return _stopped_before_trials(spec, spec_path, stopped, environ, started)
        target = resolve_target(spec, facts, budget_source, spec_path)
        _describe_target(spec, target, reporter)
        _describe_data(target.data, reporter)
        if target.train_samples is not None and (spec.search.cap is None or target.train_samples < spec.search.cap):
            reporter.note(
                f"the Trainer's train_dataset holds {target.train_samples} samples: no batch above that is "
                "tried (the Trainer never draws a larger one)"
            )
        if spec.search.unit == "tokens":
            reporter.note(
                f"unit tokens: the largest token budget every bucket length of {spec.search.bucket_lengths} "
                "fits (floor(budget / L) samples of length L); each trial runs one length"
            )
        else:  # the estimate traces input.shape as written: it does not predict another length's edge
            _describe_estimate(facts.estimate, target, reporter)
        runner = TrialRunner(spec, target, executor, python_path, reporter)
        comparison = evaluation = None
        tokens = None
        if spec.allocators and target.backend == "cuda":
            runner.allocator_label = spec.allocators[0]
        if (waits := model_imports_note(spec, runner.conditions)) is not None:
            reporter.note(waits)
        try:
            # The guess was wrong: a spare started for it is replaced. Or the check saw the model import more:
            # the process started for it imports them too (executors.local), no new one imports torch again.
            executor.prestart(runner.conditions)
        except (KeyboardInterrupt, Terminated) as stopped:
            # A signal held while the spare was replaced lands here, before the first trial: still one document.
            found = Found(stop_reason_of(stopped), None, None)
        else:
            if spec.search.unit == "tokens":
                tokens_found = token_search_and_recommend(spec, target, runner)
                found, tokens = tokens_found.found, tokens_found.tokens
            else:
                found = search_and_recommend(spec, target, runner, prior_of(facts.estimate), borrowed)
        interrupted = found.stop in (StopReason.INTERRUPTED, StopReason.TERMINATED)
        if spec.allocators and not (interrupted and target.backend == "cuda"):  # no new trials after a signal
            try:
                comparison = compare_allocators(spec, target, runner, found)
            except (KeyboardInterrupt, Terminated) as stopped:
                # The first setting's answer stands; the comparison is incomplete, and the exit code says so.
                found = replace(found, stop=stop_reason_of(stopped))
        if wants_eval_search(spec) and found.stop in (StopReason.EDGE_FOUND, StopReason.CAPPED):
            try:
                evaluation = eval_search(
                    spec, target, runner, found.recommended or found.max_fitting, found.max_fitting
                )
            except (KeyboardInterrupt, Terminated) as stopped:
                # The training answer stands; the evaluation edge is unknown, and the exit code says so.
                found = replace(found, stop=stop_reason_of(stopped))
    finally:
        settle()  # no trial runs from here on: a signal now is noted, not raised into the close or the result
        executor.close()
    if any(t.error is not None and t.error.type == NOT_TRAINED for t in runner.trials):
        # The trials prove the script trains at another batch than it is given: no earlier credit stands either.
        found = replace(found, max_fitting=None, recommended=None, recommendation=None, short_max=None)
    stop, max_fitting = found.stop, found.max_fitting
    capped_by = limited_by(spec, max_fitting, target.data, target.train_samples) if stop is StopReason.CAPPED else None
    training = [t for t in runner.trials if t.training_batch_size is None]  # the evaluation trials answer apart
    message, suggestions = explain(found, spec, target.info, training, capped_by, _stopped_by(stop))
    if evaluation is not None and (failure := eval_failure(evaluation, runner.trials)) is not None:
        # The user's evaluation pass raised (crashed, hung): the probe's error (exit 4), not a memory verdict.
        stop = evaluation.stop
        message, suggestions = f"{message}; but {failure[0]}", failure[1]
    elif evaluation is not None:
        message += "; " + eval_summary(evaluation)
    if tokens is not None:
        message = token_message(tokens, message)
    max_cycle = _cycle(runner, max_fitting)
    if max_cycle is not None:
        message += f"; at the maximum, {max_cycle}"
    unclear = [t for t in _at_max(runner, max_fitting) if t.batch_check and t.batch_check.verdict == "unclear"]
    if unclear and stop in (StopReason.EDGE_FOUND, StopReason.CAPPED):
        message += "; " + unclear_note(max_fitting, unclear[-1].batch_check)
    allocator = allocator_info(spec, target.backend, environ)
    return Result(
        isoprobe_version=__version__,
        python_version=platform.python_version(),
        torch_version=facts.torch_version,
        torchvision_version=facts.torchvision_version,
        spec_path=spec_path,
        spec=spec,
        device=target.info,
        allocator=allocator,
        job_environment=job_environment(target.backend, allocator),
        answered=stop in (StopReason.EDGE_FOUND, StopReason.CAPPED),
        max_batch_size=max_fitting,
        first_failing_batch_size=found.first_failing,
        short_max_batch_size=found.short_max,
        edge_margin=edge_margin(runner, found) if tokens is None else None,
        max_steady=_steady(runner, max_fitting),
        max_cycle=max_cycle,
        max_confirmed=_confirmed(runner, max_fitting),
        first_failing_outcome=found.first_failing_outcome,
        flaky_batch_sizes=list(found.flaky),
        edge_flaky=any(max_fitting is None or b >= max_fitting for b in found.flaky),
        limited_by=capped_by,
        recommended_batch_size=found.recommended,
        recommendation=found.recommendation,
        throughput=throughput(training, spec.recommendation.throughput_tolerance),
        memory_breakdown=memory_breakdown(training),
        eval_max_batch_size=evaluation.max_fitting if evaluation else None,
        eval_first_failing_batch_size=evaluation.first_failing if evaluation else None,
        eval_training_batch_size=evaluation.training_batch if evaluation else None,
        eval_stop_reason=evaluation.stop if evaluation else None,
        prediction=None if tokens is not None else prediction(facts.estimate, target.search_capacity, max_fitting),
        accumulation=accumulation_plan(
            spec,
            micro_batch_ceiling(
                found.recommended, max_fitting, bool(found.recommendation and found.recommendation.soaks)
            ),
            environ,
        ),
        allocator_comparison=comparison,
        stop_reason=stop,
        message=message,
        suggestions=suggestions,
        distributed=distributed_info(spec, target.backend, world_size_source, runner.trials),
        data=data_info(target.data, max_fitting),
        tokens=tokens,
        trials=runner.trials,
        total_seconds=round(time.monotonic() - started, 3),
    )


def edge_margin(runner: TrialRunner, found: Found) -> EdgeMargin | None:
    """The spread rule as this probe applied it: the maximum's free memory, and the marginal batches above it (the
    spread as read at the maximum, or at the first marginal batch where nothing fit)."""
    at = found.max_fitting if found.max_fitting is not None else min(found.marginal, default=None)
    spread = runner.spread(batch=at)
    if spread is None or (found.max_fitting is None and not found.marginal):
        return None
    capacity = runner.target.search_capacity
    ran = [
        t
        for t in runner.same_question()
        if t.training_batch_size is None and t.purpose != "memory_check" and t.allocator == runner.allocator_label
    ]
    deciding = [t for t in ran if t.steady_rule is not None]

    def free(trial) -> int | None:
        peak = trial.budget_peak_bytes if trial.budget_peak_bytes is not None else trial.peak_bytes
        return None if peak is None else capacity - peak

    at_max = [
        f
        for t in deciding
        if t.batch_size == found.max_fitting and t.outcome is Outcome.FITS and (f := free(t)) is not None
    ]
    marginal = []
    for batch in found.marginal:  # its runs: the steady ones, or the short one whose peak was already inside
        runs = [t for t in deciding if t.batch_size == batch] or [t for t in ran if t.batch_size == batch]
        fitting = [f for t in runs if t.outcome is Outcome.FITS and (f := free(t)) is not None]
        marginal.append(
            MarginalBatch(
                batch_size=batch, runs=len(runs), fitted=len(fitting), free_bytes=min(fitting) if fitting else 0
            )
        )
    return EdgeMargin(
        capacity_bytes=capacity,
        spread_bytes=spread.bytes,
        floor_bytes=spread.floor_bytes,
        observed_bytes=spread.observed_bytes,
        max_free_bytes=min(at_max) if at_max else None,
        marginal=marginal,
    )


def _at_max(runner: TrialRunner, max_fitting: int | None) -> list:
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


def _steady(runner: TrialRunner, max_fitting: int | None) -> bool:
    """Whether a trial of the maximum stepped until its peak was steady and fit."""
    return any(t.steady_rule is not None for t in _at_max(runner, max_fitting))


def _cycle(runner: TrialRunner, max_fitting: int | None) -> str | None:
    """What the maximum's deciding trial (the longest that fit there) saw of the script's cycle, in a sentence."""
    seen = [t for t in _at_max(runner, max_fitting) if t.cycle is not None]
    if not seen:
        return None
    deciding = max(seen, key=lambda t: (t.cycle.evaluation_step is not None, t.cycle.steps))
    return describe_cycle(deciding.cycle, format_bytes=format_bytes)


def _confirmed(runner: TrialRunner, max_fitting: int | None) -> bool:
    """Whether the maximum fit in more than one fresh process."""
    return len(_at_max(runner, max_fitting)) > 1


def distributed_info(spec: Spec, backend: str, world_size_source: str, trials=()) -> DistributedInfo | None:
    """What the result says of the gangs its trials ran as (None: one process per trial); ``trials``: their ranks'
    nodes, for a gang run as Slurm job steps."""
    options = spec.distributed
    if not options.gang:
        return None
    nodes = [rank.node for trial in trials for rank in (trial.ranks or []) if rank.node is not None]
    return DistributedInfo(
        strategy=options.strategy,
        world_size=options.world_size or 1,
        world_size_source=world_size_source,
        backend="nccl" if backend == "cuda" else "gloo",
        threads_per_rank=options.threads_per_rank,
        launcher="srun" if options.launcher == "srun" else "local",
        nodes=list(dict.fromkeys(nodes)),
    )


def _describe_data(scan, reporter: Reporter) -> None:
    """With spec.data: what the environment check measured, and which batch every trial trains on."""
    if scan is None:
        return
    measured = f"a seeded sample of {scan.scanned} measured" if scan.sampled else "every length measured"
    reporter.note(
        f"data: {scan.samples} samples ({measured} in {scan.seconds:.1f} s), lengths {scan.length_min:g} "
        f"to {scan.length_max:g}, mean {scan.length_mean:.1f}; every trial trains on its B longest"
    )


def _describe_estimate(estimate, target, reporter: Reporter) -> None:
    """Where the search will start, and why: the traced estimate's line, or why there is none."""
    if estimate is None:
        return
    predicted = predicted_max(estimate, target.search_capacity)
    if predicted is None:
        if estimate.note:
            reporter.note(f"{no_estimate(estimate)}; the search starts at search.start_batch_size")
        return
    reporter.note(
        f"estimate (one step traced on fake tensors in {estimate.seconds:.1f} s): "
        f"{format_bytes(estimate.fixed_bytes)} + {format_bytes(int(estimate.per_sample_bytes))} a sample, "
        f"so about {predicted} fit; the trials start near there and prove the edge"
    )


def _describe_target(spec: Spec, target, reporter: Reporter) -> None:
    info = target.info
    if info.note:
        reporter.note(info.note)
    if target.backend == "cpu" and spec.training.precision == "fp16-mixed":
        reporter.note(
            "fp16 autocast on the CPU backend: most CPUs emulate float16 math, so steps run several "
            "times slower than fp32 (8x measured on AVX-512 without FP16); the memory is what fp16 needs"
        )
    if spec.distributed.gang:
        world = spec.distributed.world_size or 1
        reporter.note(
            f"distributed: {spec.distributed.strategy}, every trial a gang of {world} rank(s) "
            f"({'nccl, one GPU each' if target.backend == 'cuda' else 'gloo, the budget per rank'}); "
            "batches are per rank"
        )
    baseline = ""
    if info.import_baseline_bytes and spec.command is None:
        baseline = f", of which importing torch takes {format_bytes(info.import_baseline_bytes)}"
    elif info.import_baseline_bytes:  # what the check's process measured is isoprobe's, not the command's
        baseline = (
            f"; isoprobe's own check took {format_bytes(info.import_baseline_bytes)} after importing torch "
            "(the command's processes import what its script imports: their readings show it)"
        )
    reporter.note(f"backend {target.backend} ({info.name}), capacity {format_bytes(info.capacity_bytes)}{baseline}")


def job_environment(backend: str, allocator: AllocatorInfo) -> dict[str, str]:
    """What the trials ran with that a job needs for the answer to hold (``Result.job_environment``)."""
    env = memory_environment(backend)
    if allocator.applies and allocator.value:
        env["PYTORCH_CUDA_ALLOC_CONF"] = allocator.value
    return env


def _stopped_by(stop: StopReason, when: str = "before an answer") -> tuple[str, str] | None:
    """A signal's stop: the message's start and end, the Slurm job's time limit named where that sent the SIGTERM
    (``system.slurm_job``: scontrol asked once, inside a job only); None for any other stop."""
    if stop not in (StopReason.INTERRUPTED, StopReason.TERMINATED):
        return None
    return signal_stop("SIGTERM" if stop is StopReason.TERMINATED else "SIGINT", when)


def _stopped_before_trials(spec: Spec, spec_path: str, stopped: BaseException, environ: dict, started: float):
    """SIGINT/SIGTERM during the environment check: still one JSON document, with no trial in it."""
    reason = stop_reason_of(stopped)
    start, end = _stopped_by(reason, "during the environment check, before any trial")
    return Result(
        isoprobe_version=__version__,
        python_version=platform.python_version(),
        spec_path=spec_path,
        spec=spec,
        allocator=allocator_info(spec, "cuda" if spec.device != "cpu" else "cpu", environ),
        answered=False,
        stop_reason=reason,
        message=start + end,
        trials=[],
        total_seconds=round(time.monotonic() - started, 3),
    )
