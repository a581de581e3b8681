"""The probe: spec -> environment check -> search over real trials -> recommendation -> Result.

This is where the pure parts (search, recommend) meet the edges (supervisor).
It never imports torch: facts about torch and the GPU come from an ``inspect``
child, started once before the trials, so the parent cannot create a CUDA
context even by accident.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from isoprobe import __version__
from isoprobe.errors import ProbeError, Problem, SpecError, Terminated
from isoprobe.outcomes import Outcome, maybe_allocation_failure
from isoprobe.output import Reporter
from isoprobe.recommend import advise
from isoprobe.result import (
    AllocatorComparison,
    AllocatorInfo,
    AllocatorOutcome,
    Applied,
    Sizes,
    DeviceInfo,
    ErrorInfo,
    MemoryModel,
    Recommendation,
    Result,
    StopReason,
    Trial,
)
from isoprobe.search import Limits, Observation, doubling_step, guided_step, progress, run_search
from isoprobe.spec import Spec
from isoprobe.supervisor import ChildRun, Launcher, classify_exit, run_child
from isoprobe.hardware import cpu_name, ram_bytes
from isoprobe.insights import memory_breakdown, step_throughput, throughput
from isoprobe.plan import accumulation_plan
from isoprobe.units import format_bytes

#: CPU backend budget when the spec sets none. Big enough for resnet50 at a
#: handful of samples (imports take ~0.9 GiB of it), small enough that the
#: search ends in minutes on 2 cores.
DEFAULT_CPU_BUDGET = 3 * 1024**3
#: The inspect child imports torch and builds the model on the meta device.
INSPECT_TIMEOUT_SECONDS = 300.0
#: Data segment a trial needs beyond the import baseline before any model exists.
_MIN_BUDGET_MARGIN = 64 * 1024**2


@dataclass(frozen=True)
class Target:
    """The resolved device: where trials run and the memory they may use."""

    backend: Literal["cpu", "cuda"]
    device: str
    info: DeviceInfo
    #: CUDA: the memory free when the environment was checked (other processes and a context already
    #: taken out); what the allocator's reserved peak can actually reach.
    free_bytes: int | None = None

    @property
    def search_capacity(self) -> int:
        """The memory the search's line predicts against: the capacity, or less where less is free."""
        if self.free_bytes is None:
            return self.info.capacity_bytes
        return min(self.info.capacity_bytes, self.free_bytes)


# --------------------------------------------------------------------------- environment


def resolve_target(spec: Spec, facts: dict, budget_source: str | None, source: str = "spec") -> Target:
    """Pick the backend from the spec's device and what the inspect child saw. Pure given ``facts``."""
    requested = spec.device
    devices = facts.get("cuda_devices") or []
    note = None
    if requested == "auto":
        if devices:
            requested_device, note = "cuda:0", "device auto: a GPU is visible, using cuda:0"
        else:
            requested_device = "cpu"
            note = "device auto: no GPU visible, using the CPU backend (memory capped per trial)"
    else:
        requested_device = "cuda:0" if requested == "cuda" else requested
    if requested_device == "cpu":
        budget = spec.memory_budget or DEFAULT_CPU_BUDGET
        source = budget_source if spec.memory_budget else "default"
        baseline = (facts.get("memory_after_import") or {}).get("data")
        if baseline and budget < baseline + _MIN_BUDGET_MARGIN:
            raise SpecError(
                source,
                [
                    Problem(
                        "memory_budget",
                        f"{format_bytes(budget)} is less than a trial needs just to import torch "
                        f"({format_bytes(baseline)} measured here)",
                        f"give at least {format_bytes(baseline + 512 * 1024**2)} for a small model",
                    )
                ],
            )
        info = DeviceInfo(
            backend="cpu",
            requested=spec.device,
            name=cpu_name(),
            total_memory_bytes=ram_bytes(),
            memory_budget_bytes=budget,
            budget_source=source,
            capacity_bytes=budget,
            import_baseline_bytes=baseline,
            note=note,
        )
        return Target("cpu", "cpu", info)
    index = int(requested_device.split(":")[1])
    if not devices:
        raise SpecError(
            source,
            [Problem("device", f"{requested} was asked for, but torch sees no GPU here", "use device: auto or cpu")],
        )
    if index >= len(devices):
        raise SpecError(
            source,
            [Problem("device", f"{requested} does not exist: {len(devices)} GPU(s) visible", "pick cuda:0 .. "
                     f"cuda:{len(devices) - 1}")],
        )
    total = devices[index]["total_memory_bytes"]
    budget = spec.memory_budget
    if budget is not None and budget > total:
        raise SpecError(
            source,
            [Problem("memory_budget", f"{format_bytes(budget)} is more than the GPU has ({format_bytes(total)})",
                     "lower it, or leave it unset to use the whole GPU")],
        )
    info = DeviceInfo(
        backend="cuda",
        requested=spec.device,
        name=devices[index]["name"],
        index=index,
        total_memory_bytes=total,
        memory_budget_bytes=budget,
        budget_source=budget_source if budget is not None else None,
        capacity_bytes=budget or total,
        note=note,
    )
    return Target("cuda", requested_device, info, devices[index].get("free_memory_bytes"))


def allocator_info(spec: Spec, backend: str, environ: dict[str, str]) -> AllocatorInfo:
    if spec.allocators and backend == "cuda":
        value, source = spec.allocators[0], "spec"
    elif spec.allocator is not None:
        value, source = spec.allocator, "spec"
    elif environ.get("PYTORCH_CUDA_ALLOC_CONF") or environ.get("PYTORCH_ALLOC_CONF"):
        value = environ.get("PYTORCH_CUDA_ALLOC_CONF") or environ.get("PYTORCH_ALLOC_CONF")
        source = "environment"
    else:
        value, source = None, "none"
    variables = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"] if spec.allocator is not None or (
        spec.allocators and backend == "cuda") else []
    return AllocatorInfo(value=value, source=source, variables=variables, applies=backend == "cuda")


def inspect_environment(spec: Spec, spec_path: str, workdir: Path, python_path: list[str]) -> dict:
    """Run the inspect child; map what it cannot build to a SpecError."""
    run = run_child(
        {"mode": "inspect", "spec": spec.model_dump(mode="json"), "python_path": python_path, "device": spec.device},
        workdir,
        backend="cpu" if spec.device == "cpu" else "cuda",
        timeout=INSPECT_TIMEOUT_SECONDS,
        memory_limit=None,
        allocator=spec.allocator,
        name="inspect",
    )
    result = next((e for e in run.events if e.get("event") == "result"), None)
    if result is None or run.timed_out:
        how = "timed out" if run.timed_out else f"exited with status {run.returncode}"
        raise ProbeError(f"the environment check (importing torch in a child process) {how}", run.stderr_tail)
    if result["problems"]:
        raise SpecError(spec_path, [_inspect_problem(p) for p in result["problems"]])
    return result["facts"]


_INSPECT_STAGES = {
    # stage: (field, what went wrong, how to fix it)
    "model": ("model", "cannot be built", "check the name, the factory's module and function, and the kwargs"),
    "optimizer": ("optimizer.kwargs", "cannot be built", "check the optimizer's keyword arguments"),
    "allocator": ("allocator", "rejected by torch",
                  "check the allocator string (keys such as expandable_segments:True, max_split_size_mb:128)"),
    "input": ("input.shape", "does not fit the model", "set input.shape to what the model takes for one sample"),
    "target": ("target", "does not match the model's output",
               "set target.classes (or target.shape) to the model's output, or change the model's kwargs"),
    "precision": ("training.precision", "cannot run on this device", "use fp32 or a precision the device supports"),
    "checkpointing": ("training.gradient_checkpointing", "cannot be applied to this model",
                      "turn it off, or wrap the model's blocks in nn.Sequential stages in the factory"),
    "batch": ("model.batch", "cannot be loaded", "check the module and function name"),
    "loss": ("model.loss", "cannot be loaded", "check the module and function name"),
}


def _inspect_problem(problem: dict) -> Problem:
    field, what, fix = _INSPECT_STAGES.get(problem["stage"], _INSPECT_STAGES["model"])
    return Problem(field, f"{what}: {problem['type']}: {problem['message']}", fix)


# --------------------------------------------------------------------------- trials


def _throughput(verdict, batch_size: int, result: dict) -> tuple[float | None, float | None]:
    if verdict.outcome is not Outcome.FITS:
        return None, None
    return step_throughput(batch_size, result.get("step_seconds", []))


def _rounded(value, digits: int):
    return None if value is None else round(float(value), digits)


def _applied(values: dict | None) -> Applied | None:
    """The child's report of what ran; keys this version does not know are dropped, not fatal."""
    if not values:
        return None
    return Applied(**{k: v for k, v in values.items() if k in Applied.model_fields})


def trial_from_run(run: ChildRun, index: int, batch_size: int, purpose: str) -> Trial:
    verdict = classify_exit(run)
    result = verdict.result or {}
    error = result.get("error")
    keep_stderr = verdict.outcome in (Outcome.CRASHED, Outcome.TIMED_OUT, Outcome.ERROR) or bool(verdict.evidence)
    speed, spread = _throughput(verdict, batch_size, result)
    return Trial(
        index=index,
        batch_size=batch_size,
        purpose=purpose,
        outcome=verdict.outcome,
        peak_bytes=result.get("peak_bytes"),
        peak_allocated_bytes=result.get("peak_allocated_bytes"),
        budget_peak_bytes=result.get("budget_peak_bytes"),
        base_bytes=result.get("base_bytes"),
        step_seconds=[round(s, 4) for s in result.get("step_seconds", [])],
        samples_per_second=_rounded(speed, 3),
        step_seconds_spread=_rounded(spread, 4),
        sizes=Sizes(**result["sizes"]) if verdict.outcome is Outcome.FITS and result.get("sizes") else None,
        compile_seconds=_rounded(result.get("compile_seconds"), 3),
        eval_seconds=_rounded(result.get("eval_seconds"), 4),
        applied=_applied(result.get("applied")),
        seconds=round(run.seconds, 3),
        warm_start=run.warm,
        phase=verdict.phase,
        error=ErrorInfo(**error) if error else None,
        exit_code=run.returncode,
        signal=verdict.signal_name,
        stderr_tail=run.stderr_tail if keep_stderr and run.stderr_tail else None,
        reclassified=verdict.evidence,
    )


_SEARCH_PURPOSES = ("search", "retry", "confirmation")


class TrialRunner:
    """The search's oracle: one fresh child process per call."""

    def __init__(self, spec: Spec, target: Target, launcher: Launcher, python_path: list[str], reporter: Reporter):
        self.spec = spec
        self.target = target
        self.launcher = launcher
        self.python_path = python_path
        self.reporter = reporter
        self.trials: list[Trial] = []
        self.allocator_label: str | None = None  # set while comparing allocators: tags each trial

    def run(self, batch_size: int, purpose: str = "search") -> Trial:
        """One trial; an ambiguous library error is re-run with more memory before it is classified."""
        budget = self.target.info.memory_budget_bytes
        trial = self._launch(batch_size, purpose, budget)
        if (
            trial.outcome is Outcome.ERROR
            and trial.error is not None
            and maybe_allocation_failure(trial.error.message)
            and budget is not None
        ):
            larger = self._larger_budget(budget)
            check = self._launch(batch_size, "memory_check", larger)
            if check.outcome is Outcome.FITS:
                trial = trial.model_copy(
                    update={
                        "outcome": Outcome.OUT_OF_MEMORY,
                        "reclassified": (
                            f"{trial.error.type}: {trial.error.message.splitlines()[0]} under the "
                            f"{format_bytes(budget)} budget, but batch {batch_size} fit with "
                            f"{format_bytes(larger) if larger else 'no cap'} (trial {check.index}): "
                            "an allocation failure"
                        ),
                    }
                )
                self.trials[trial.index - 1] = trial
                self.reporter.note(f"trial {trial.index} reclassified as out_of_memory: {trial.reclassified}")
        return trial

    def _larger_budget(self, budget: int) -> int | None:
        """Twice the budget: on CPU capped at the machine's RAM; on CUDA no cap at all (the whole card)."""
        if self.target.backend == "cuda":
            return None
        return min(2 * budget, self.target.info.total_memory_bytes)

    def _launch(self, batch_size: int, purpose: str, budget: int | None) -> Trial:
        index = len(self.trials) + 1
        request = {
            "mode": "trial",
            "spec": self.spec.model_dump(mode="json"),
            "batch_size": batch_size,
            "device": self.target.device,
            "memory_budget_bytes": budget,
            "python_path": self.python_path,
        }
        run = self.launcher.run(
            request,
            timeout=self.spec.search.trial_timeout,
            memory_limit=budget if self.target.backend == "cpu" else None,
            name=f"trial{index:03d}-b{batch_size}",
        )
        trial = trial_from_run(run, index, batch_size, purpose)
        if self.allocator_label is not None:
            trial = trial.model_copy(update={"allocator": self.allocator_label})
        self.trials.append(trial)
        self.reporter.trial(trial)
        return trial

    def observe(self, batch_size: int) -> Observation:
        """The search's oracle. A batch seen before is a retry (after a crash or timeout) or a confirmation."""
        earlier = [t for t in self.trials if t.batch_size == batch_size and t.purpose in _SEARCH_PURPOSES
                   and t.allocator == self.allocator_label]
        if not earlier:
            purpose = "search"
        elif earlier[-1].outcome in (Outcome.CRASHED, Outcome.TIMED_OUT):
            purpose = "retry"
        else:
            purpose = "confirmation"
        trial = self.run(batch_size, purpose)
        if trial.outcome is not Outcome.FITS:
            return Observation(batch_size, trial.outcome)
        peak = trial.budget_peak_bytes if trial.budget_peak_bytes is not None else trial.peak_bytes
        return Observation(batch_size, trial.outcome, peak, trial.base_bytes)


# --------------------------------------------------------------------------- the probe


def run_probe(
    spec: Spec,
    spec_path: str,
    reporter: Reporter,
    *,
    budget_source: str = "spec",
    environ: dict[str, str] | None = None,
) -> Result:
    """Everything ``isoprobe run`` does between a valid spec and the printed result."""
    environ = dict(os.environ if environ is None else environ)
    started = time.monotonic()
    python_path = [str(Path(spec_path).resolve().parent)]
    with tempfile.TemporaryDirectory(prefix="isoprobe-") as scratch:
        workdir = Path(scratch)
        likely_backend, likely_limit = _likely_target(spec)
        launcher = _launcher(spec, workdir, likely_backend)
        try:
            reporter.note("checking the environment (importing torch in a child process)")
            try:
                # The first trial's process imports torch while the inspect child does the same. Inside
                # this try: a signal held while the spare starts lands as it ends, and must still give a
                # JSON document (found by test_interrupt with warm start on: 1 run in the full suite).
                launcher.prestart(likely_limit)
                facts = inspect_environment(spec, spec_path, workdir, python_path)
            except (KeyboardInterrupt, Terminated) as stopped:
                return _stopped_before_trials(spec, spec_path, stopped, environ, started)
            target = resolve_target(spec, facts, budget_source, spec_path)
            info = target.info
            if info.note:
                reporter.note(info.note)
            if target.backend == "cpu" and spec.training.precision == "fp16-mixed":
                reporter.note(
                    "fp16 autocast on the CPU backend: most CPUs emulate float16 math, so steps run several "
                    "times slower than fp32 (8x measured on AVX-512 without FP16); the memory is what fp16 needs"
                )
            reporter.note(
                f"backend {target.backend} ({info.name}), capacity {format_bytes(info.capacity_bytes)}"
                + (f", of which importing torch takes {format_bytes(info.import_baseline_bytes)}"
                   if info.import_baseline_bytes else "")
            )
            if target.backend != launcher.backend:  # the guess was wrong: its spare has the wrong environment
                launcher.close()
                launcher = _launcher(spec, workdir, target.backend)
            runner = TrialRunner(spec, target, launcher, python_path, reporter)
            comparison = None
            if spec.allocators and target.backend == "cuda":
                runner.allocator_label = spec.allocators[0]
            found = _search(spec, target, runner)
            if spec.allocators:
                def relaunch(setting: str) -> Launcher:
                    nonlocal launcher
                    launcher.close()
                    launcher = _launcher(spec, workdir, target.backend, allocator=_allocator_value(setting))
                    return launcher

                try:
                    comparison = compare_allocators(spec, target, runner, found, relaunch)
                except (KeyboardInterrupt, Terminated) as stopped:
                    # The first setting's answer stands; the comparison is incomplete, and the exit code says so.
                    reason = StopReason.INTERRUPTED if isinstance(stopped, KeyboardInterrupt) else StopReason.TERMINATED
                    found = replace(found, stop=reason)
        finally:
            launcher.close()
    stop, max_fitting, first_failing = found.stop, found.max_fitting, found.first_failing
    limited_by = _limited_by(spec, max_fitting) if stop is StopReason.CAPPED else None
    message, suggestions = _explain(found, spec, info, runner.trials, limited_by)
    return Result(
        isoprobe_version=__version__,
        python_version=platform.python_version(),
        torch_version=facts.get("torch_version"),
        torchvision_version=facts.get("torchvision_version"),
        spec_path=spec_path,
        spec=spec,
        device=info,
        allocator=allocator_info(spec, target.backend, environ),
        answered=stop in (StopReason.EDGE_FOUND, StopReason.CAPPED),
        max_batch_size=max_fitting,
        first_failing_batch_size=first_failing,
        first_failing_outcome=found.first_failing_outcome,
        flaky_batch_sizes=list(found.flaky),
        edge_flaky=any(max_fitting is None or b >= max_fitting for b in found.flaky),
        limited_by=limited_by,
        recommended_batch_size=found.recommended,
        recommendation=found.recommendation,
        throughput=throughput(runner.trials, spec.recommendation.throughput_tolerance),
        memory_breakdown=memory_breakdown(runner.trials),
        accumulation=accumulation_plan(spec, found.recommended or found.max_fitting, environ),
        allocator_comparison=comparison,
        stop_reason=stop,
        message=message,
        suggestions=suggestions,
        trials=runner.trials,
        total_seconds=round(time.monotonic() - started, 3),
    )


def _allocator_value(setting: str | None) -> str | None:
    """An ``allocators`` entry as the launcher takes it: 'default' is '' (the variables removed)."""
    return "" if setting == "default" else setting


def _launcher(spec: Spec, workdir: Path, backend: str, allocator: str | None = None) -> Launcher:
    if allocator is None:
        allocator = _allocator_value(spec.allocators[0]) if spec.allocators and backend == "cuda" else spec.allocator
    return Launcher(workdir, backend=backend, allocator=allocator, preload=_preload(spec),
                    warm=spec.search.warm_start)


def compare_allocators(spec: Spec, target: Target, runner: TrialRunner, first: "Found", relaunch) -> AllocatorComparison:
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
        runner.launcher = relaunch(setting)
        runner.allocator_label = setting
        runner.reporter.note(f"allocator {setting!r}: searching from batch {start or spec.search.start_batch_size}")
        found = _edge_search(spec, target, runner, start=start)
        if found.stop is StopReason.START_DOES_NOT_FIT and start and start > spec.search.start_batch_size:
            found = _edge_search(spec, target, runner, start=None)
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


def _allocator_outcome(setting: str, found: "Found", runner: TrialRunner) -> AllocatorOutcome:
    return AllocatorOutcome(
        setting=setting,
        max_batch_size=found.max_fitting,
        first_failing_batch_size=found.first_failing,
        stop_reason=found.stop.value,
        trials=sum(1 for t in runner.trials if t.allocator == setting),
    )


def _likely_target(spec: Spec) -> tuple[str, int | None]:
    """The backend and CPU memory cap the trials will most likely get, known before the inspect child answers.

    Only used to start the first trial's process early: if the guess is wrong, that
    process is discarded, never used. ``auto`` counts as CPU where the NVIDIA
    driver shows no GPU (no /proc/driver/nvidia/gpus entry).
    """
    no_gpu = not any(Path("/proc/driver/nvidia/gpus").glob("*"))
    if spec.device == "cpu" or (spec.device == "auto" and no_gpu):
        return "cpu", spec.memory_budget or DEFAULT_CPU_BUDGET
    return "cuda", None


def _preload(spec: Spec) -> tuple[str, ...]:
    """What a warm child imports before its request: everything a trial imports that touches no device.

    torch._dynamo is on the list because constructing any torch optimizer imports
    it (torch/_compile.py), about 2.5 s measured here: without it the warm child
    would save the import of torch only to pay as much again in the build.
    """
    modules = ["torch", "torch._dynamo"]
    if spec.model.torchvision:
        modules.append("torchvision")
    elif spec.model.timm:
        modules.append("timm")
    elif spec.model.huggingface:
        modules.append("transformers")
    return tuple(modules)


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


def _edge_search(spec: Spec, target: Target, runner: TrialRunner, start: int | None) -> Found:
    """The edge search alone (no recommendation), from ``start`` or the spec's start batch."""
    limits = Limits(
        start=start or spec.search.start_batch_size,
        cap=spec.search.cap,
        retries=spec.search.retries,
        confirmations=spec.search.confirmations,
        capacity=target.search_capacity,
    )
    step = guided_step if spec.search.strategy == "guided" else doubling_step
    conclusion = run_search(runner.observe, limits, [], step=step)
    return Found(StopReason(conclusion.stop.value), conclusion.max_fitting, conclusion.first_failing,
                 conclusion.first_failing_outcome, conclusion.flaky)


def _search(spec: Spec, target: Target, runner: TrialRunner) -> Found:
    """The edge search over real trials, then the recommendation; an interrupt keeps the trials so far."""
    limits = Limits(
        start=spec.search.start_batch_size,
        cap=spec.search.cap,
        retries=spec.search.retries,
        confirmations=spec.search.confirmations,
        capacity=target.search_capacity,
    )
    step = guided_step if spec.search.strategy == "guided" else doubling_step
    history: list[Observation] = []
    try:
        conclusion = run_search(runner.observe, limits, history, step=step)
        found = Found(
            StopReason(conclusion.stop.value),
            conclusion.max_fitting,
            conclusion.first_failing,
            conclusion.first_failing_outcome,
            conclusion.flaky,
        )
        if not conclusion.exact:
            return found
        recommended, recommendation = _recommend(spec, target, runner, found.max_fitting, found.first_failing)
        if spec.recommendation.objective == "throughput" and recommended is not None:
            recommended, recommendation = _prefer_throughput(spec, runner.trials, recommended, recommendation)
        return replace(found, recommended=recommended, recommendation=recommendation)
    except (KeyboardInterrupt, Terminated) as stopped:
        reason = StopReason.INTERRUPTED if isinstance(stopped, KeyboardInterrupt) else StopReason.TERMINATED
        known = progress(history, limits)
        return Found(reason, known.max_fitting, known.first_failing, known.first_failing_outcome, known.flaky)


def _stopped_before_trials(spec: Spec, spec_path: str, stopped: BaseException, environ: dict, started: float):
    """SIGINT/SIGTERM during the environment check: still one JSON document, with no trial in it."""
    reason = StopReason.INTERRUPTED if isinstance(stopped, KeyboardInterrupt) else StopReason.TERMINATED
    return Result(
        isoprobe_version=__version__,
        python_version=platform.python_version(),
        spec_path=spec_path,
        spec=spec,
        allocator=allocator_info(spec, "cuda" if spec.device != "cpu" else "cpu", environ),
        answered=False,
        stop_reason=reason,
        message=f"stopped by {'SIGTERM' if reason is StopReason.TERMINATED else 'SIGINT'} "
                "during the environment check, before any trial",
        trials=[],
        total_seconds=round(time.monotonic() - started, 3),
    )


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


def _limited_by(spec: Spec, max_fitting: int | None) -> str:
    if spec.search.dataset_size is not None and max_fitting == spec.search.dataset_size and (
        spec.search.max_batch_size is None or spec.search.dataset_size <= spec.search.max_batch_size
    ):
        return "dataset_size"
    if spec.search.max_batch_size is not None and max_fitting == spec.search.max_batch_size:
        return "max_batch_size"
    return "search_ceiling"


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


def _explain(found: Found, spec: Spec, info: DeviceInfo, trials: list[Trial], limited_by: str | None):
    """The one-sentence answer and what to try next, from what the search established."""
    stop, max_fitting, first_failing, recommended = found.stop, found.max_fitting, found.first_failing, found.recommended
    where = f"{info.backend} ({format_bytes(info.capacity_bytes)})"
    last = trials[-1] if trials else None
    if stop is StopReason.EDGE_FOUND:
        if found.first_failing_outcome is Outcome.OUT_OF_MEMORY:
            how = "runs out of memory"
        else:
            how = f"{found.first_failing_outcome.value} (counted as failing; not proven to be memory)"
        text = f"batch {max_fitting} fits and {first_failing} {how} on {where}"
        if found.flaky:
            text += f"; flaky batches (fit in one run, failed in another): {list(found.flaky)}"
        return text + (f"; recommended {recommended}" if recommended else ""), []
    if stop is StopReason.CAPPED:
        text = f"batch {max_fitting} fits; larger batches were not tried because of {limited_by}"
        return text + (f"; recommended {recommended}" if recommended else ""), []
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
    best = f"; largest batch that fit so far: {max_fitting}" if max_fitting else ""
    return f"stopped by {'SIGTERM' if stop is StopReason.TERMINATED else 'SIGINT'} before an answer{best}", []
