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
from isoprobe.pipeline.edge import stop_reason_of
from isoprobe.pipeline.environment import (
    DEFAULT_CPU_BUDGET,
    Target,
    allocator_info,
    inspect_environment,
    likely_backend,
    model_imports_note,
    resolve_target,
    trial_conditions,
)
from isoprobe.pipeline.explain import Found
from isoprobe.pipeline.kinds import (
    Probed,
    Verdict,
    at_max,
    command_refusal,
    main_search,
    message,
    stopped_by,
    with_allocators,
    with_evaluation,
)
from isoprobe.pipeline.notes import describe_probe, environment_check_note
from isoprobe.pipeline.prediction import prediction
from isoprobe.pipeline.trials import TrialRunner
from isoprobe.protocol.messages import Facts
from isoprobe.report.assemble import Answer, Evaluated, Setting, Views, assemble_result
from isoprobe.report.device import AllocatorInfo, DistributedInfo
from isoprobe.report.edge import EdgeMargin, MarginalBatch
from isoprobe.report.outcomes import Outcome
from isoprobe.report.output import Reporter
from isoprobe.report.result import Result
from isoprobe.search.history import Borrowed
from isoprobe.search.insights import memory_breakdown, throughput
from isoprobe.search.plan import accumulation_plan, micro_batch_ceiling
from isoprobe.spec.model import Spec
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

    ``executor`` runs the environment check and the trials (default: the local one); it is closed before this
    returns, so nothing it started outlives the probe. ``borrowed``: bounds another frontier point proved, which
    only narrow where the search looks (``search.frontier_bounds``). The kinds of probe add their parts in
    ``pipeline.kinds``; the result is assembled by ``report.assemble``.
    """
    environ = dict(os.environ if environ is None else environ)
    started = time.monotonic()
    python_path = [str(Path(spec_path).resolve().parent)]
    executor = executor if executor is not None else local_executor(spec)
    try:
        reporter.note(environment_check_note(spec))
        try:
            # The first trial's process imports torch while the inspect child does the same. Inside
            # this try: a signal held while the spare starts lands as it ends, and must still give a
            # JSON document (found by test_interrupt with warm start on: 1 run in the full suite).
            backend = likely_backend(spec)
            conditions = trial_conditions(spec, backend, spec.memory_budget or DEFAULT_CPU_BUDGET)
            executor.prestart(replace(conditions, command_plan=command_plan(spec, backend, None, None)))
            facts = inspect_environment(spec, spec_path, executor, python_path)
        except (KeyboardInterrupt, Terminated) as stopped:
            return _stopped_before_trials(spec, spec_path, stopped, environ, started)
        target = resolve_target(spec, facts, budget_source, spec_path)
        describe_probe(spec, target, facts, reporter)
        runner = TrialRunner(spec, target, executor, python_path, reporter)
        probed = _trials(spec, target, runner, executor, facts, borrowed, reporter)
    finally:
        settle()  # no trial runs from here on: a signal now is noted, not raised into the close or the result
        executor.close()
    probed = command_refusal(probed, runner)
    verdict = message(spec, target, target.info, runner, probed)
    allocator = allocator_info(spec, target.backend, environ)
    setting = Setting(
        spec_path=spec_path,
        spec=spec,
        isoprobe_version=__version__,
        python_version=platform.python_version(),
        torch_version=facts.torch_version,
        torchvision_version=facts.torchvision_version,
        device=target.info,
        allocator=allocator,
        job_environment=job_environment(target.backend, allocator),
        distributed=distributed_info(spec, target.backend, world_size_source, runner.trials),
        data=data_info(target.data, probed.found.max_fitting),
    )
    return assemble_result(
        setting,
        _answer(runner, probed, verdict),
        _views(spec, target, runner, facts, probed, environ),
        verdict.message,
        verdict.suggestions,
        round(time.monotonic() - started, 3),
    )


def _trials(
    spec: Spec,
    target: Target,
    runner: TrialRunner,
    executor: Executor,
    facts: Facts,
    borrowed: Borrowed | None,
    reporter: Reporter,
) -> Probed:
    """The trials: the main search, then the allocators' comparison and the evaluation edge (``pipeline.kinds``)."""
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
        return Probed(Found(stop_reason_of(stopped), None, None))
    probed = main_search(spec, target, runner, facts, borrowed)
    probed = with_allocators(spec, target, runner, probed)
    return with_evaluation(spec, target, runner, probed)


def _answer(runner: TrialRunner, probed: Probed, verdict: Verdict) -> Answer:
    """What the search answered, with what its deciding trials at the maximum showed."""
    found = probed.found
    return Answer(
        stop=verdict.stop,
        max_fitting=found.max_fitting,
        first_failing=found.first_failing,
        first_failing_outcome=found.first_failing_outcome,
        short_max=found.short_max,
        flaky=tuple(found.flaky),
        limited_by=verdict.limited_by,
        recommended=found.recommended,
        recommendation=found.recommendation,
        edge_margin=edge_margin(runner, found) if probed.tokens is None else None,
        max_steady=any(t.steady_rule is not None for t in at_max(runner, found.max_fitting)),
        max_cycle=verdict.max_cycle,
        max_confirmed=len(at_max(runner, found.max_fitting)) > 1,  # it fit in more than one fresh process
    )


def _views(
    spec: Spec, target: Target, runner: TrialRunner, facts: Facts, probed: Probed, environ: dict[str, str]
) -> Views:
    """What else the result shows: the insights read from the training trials and each kind's part."""
    found, evaluation = probed.found, probed.evaluation
    training = [t for t in runner.trials if t.training_batch_size is None]  # the evaluation trials answer apart
    soaked = bool(found.recommendation and found.recommendation.soaks)
    return Views(
        throughput=throughput(training, spec.recommendation.throughput_tolerance),
        memory_breakdown=memory_breakdown(training),
        prediction=None
        if probed.tokens is not None
        else prediction(facts.estimate, target.search_capacity, found.max_fitting),
        accumulation=accumulation_plan(
            spec, micro_batch_ceiling(found.recommended, found.max_fitting, soaked), environ
        ),
        allocator_comparison=probed.comparison,
        tokens=probed.tokens,
        evaluated=Evaluated(
            evaluation.max_fitting, evaluation.first_failing, evaluation.training_batch, evaluation.stop
        )
        if evaluation
        else None,
        trials=runner.trials,
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


def job_environment(backend: str, allocator: AllocatorInfo) -> dict[str, str]:
    """What the trials ran with that a job needs for the answer to hold (``Result.job_environment``)."""
    env = memory_environment(backend)
    if allocator.applies and allocator.value:
        env["PYTORCH_CUDA_ALLOC_CONF"] = allocator.value
    return env


def _stopped_before_trials(spec: Spec, spec_path: str, stopped: BaseException, environ: dict, started: float) -> Result:
    """SIGINT/SIGTERM during the environment check: still one JSON document, with no trial in it."""
    reason = stop_reason_of(stopped)
    said = stopped_by(reason, "during the environment check, before any trial")
    start, end = said if said is not None else (f"stopped ({reason.value})", "")
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
