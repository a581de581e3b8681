"""Parallel trials on one node (``search.parallel``): how many slots, and a round of trials, one per slot.

Slots are homogeneous, checked before the search: on CUDA a slot is a visible
GPU from the spec's device on (``device: cuda:2`` with two slots is cuda:2 and
cuda:3), and every one must be the target's model with the same memory and as
much of it free (NVML's facts), so that a batch's verdict does not depend on the
slot it ran in. On the CPU
backend a slot is one memory budget (each child is capped by RLIMIT_DATA at the
budget), and at most ``min(cores, 80 % of RAM // budget)`` run at once: the caps
together stay within the machine (another trial's memory must not push one
over), and each trial keeps a core. On a 2-core machine with a 1.25 GiB budget
that is 2; ``auto`` takes that maximum, a number above it is lowered, with a note.

``observe_round`` is ``TrialRunner.observe`` for several batches at once: the
requests run concurrently (``executors.rounds``), each CUDA slot on its own
device, and each becomes a ``Trial`` in the runner's list, printed, and an
observation of the search as soon as its child ends (in the order they end):
an interrupt mid-round keeps what had ended. An ambiguous library error gets
the runner's usual evidence (a re-run with more memory), one after another,
after the round.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from isoprobe.errors import Problem, SpecError
from isoprobe.pipeline.data import request_indices
from isoprobe.pipeline.environment import DEFAULT_CPU_BUDGET, Target
from isoprobe.protocol.messages import TrialRequest
from isoprobe.report.outcomes import Outcome, maybe_allocation_failure
from isoprobe.search.history import Observation
from isoprobe.spec.model import Spec
from isoprobe.spec.units import format_bytes

if TYPE_CHECKING:
    from isoprobe.executors import ChildRun
    from isoprobe.pipeline.trials import TrialRunner
    from isoprobe.report.cycle import CycleRule
    from isoprobe.report.steady import SteadyRule
    from isoprobe.report.trial import Trial
    from isoprobe.search.edge_search import Conclusion
    from isoprobe.search.history import Limits
    from isoprobe.search.parallel import Observed
    from isoprobe.search.steps import Step

#: The share of the machine's RAM the CPU slots' caps may add up to.
CPU_RAM_SHARE = 0.8
#: How much less free memory than the target's a slot's GPU may have (NVML's readings of idle GPUs differ by a
#: few MiB; another process's CUDA context alone holds 250-600 MiB, so any process on a slot's GPU is seen).
SLOT_FREE_TOLERANCE = 128 * 1024**2


def cpu_slot_limit(budget: int, cores: int, ram: int) -> int:
    """The most CPU slots: one core each, and the caps within ``CPU_RAM_SHARE`` of the RAM (at least 1)."""
    return max(1, min(cores, int(ram * CPU_RAM_SHARE) // max(1, budget)))


def resolve_slots(spec: Spec, target: Target, say, gpus: list[dict] | None = None) -> list[str]:
    """The device of each slot (``['cuda:2', 'cuda:3']``, ``['cpu', 'cpu']``); one slot when parallel is 1.

    CUDA slots start at the spec's device (the target) and take the visible GPUs after it. ``gpus``: the visible
    GPUs with NVML's facts, free memory included (``hardware.visible_gpus``); read here when None. A spec error
    when the GPUs are fewer than asked for after the target, differ from it, have less free memory than it, or
    cannot be named from here.
    """
    asked = spec.search.parallel
    if asked == 1 or spec.distributed.gang:
        return [target.device]
    if target.backend == "cuda":
        why = None
        if gpus is None:
            from isoprobe.system.hardware import visible_devices, visible_gpus

            gpus, why = visible_gpus(visible_devices(os.environ))
        return cuda_slots(asked, target, gpus or [], why)
    from isoprobe.system.hardware import ram_bytes

    budget = target.info.memory_budget_bytes or DEFAULT_CPU_BUDGET
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    most = cpu_slot_limit(budget, cores, ram_bytes())
    count = most if asked == "auto" else min(asked, most)
    if asked != "auto" and asked > most:
        say(
            f"search.parallel {asked} lowered to {most}: CPU slots are at most min({cores} cores, "
            f"{CPU_RAM_SHARE:.0%} of RAM // the budget)"
        )
    return ["cpu"] * count


def cuda_slots(asked: int | str, target: Target, gpus: list[dict], why: str | None = None) -> list[str]:
    """Pure: the CUDA slots for ``search.parallel`` = ``asked`` (a number or "auto"), from the target's GPU on.

    Each slot's GPU must be the target's model and size (NVML's name and total), and have as much free memory
    as the target's (NVML's readings, taken at once, ``SLOT_FREE_TOLERANCE`` apart at most), or, under a budget,
    the budget free: a slot with another process's memory on it would run out sooner, and a batch's verdict
    would depend on its slot. ``why``: why ``gpus`` is empty, if it is known.
    """
    first = target.info.index or 0
    if not gpus:
        raise _refused(
            f"{asked} slots asked, but the GPUs after {target.device} cannot be checked: " + (why or "NVML lists none"),
            "set search.parallel: 1, or make the GPUs known (see the message)",
        )
    available = len(gpus) - first
    count = available if asked == "auto" else int(asked)
    if count < 1 or count > available:
        raise _refused(
            f"{count} slots start at the spec's device {target.device} and need cuda:{first}.."
            f"cuda:{first + count - 1}, but {len(gpus)} GPUs are visible (cuda:0..cuda:{len(gpus) - 1})",
            f"ask for at most {max(available, 1)} slots, or name an earlier device (device: cuda:"
            f"{max(0, len(gpus) - count)}), or make CUDA_VISIBLE_DEVICES name more GPUs",
        )
    slots = gpus[first : first + count]
    kinds = {(g.get("name"), g.get("total_memory_bytes")) for g in slots}
    if len(kinds) > 1:
        raise _refused(
            f"the slots' GPUs differ: {sorted(kinds)}", "make CUDA_VISIBLE_DEVICES name GPUs of one model and size"
        )
    readings = [g.get("free_memory_bytes") for g in slots]
    free: list[int] = [f for f in readings if f is not None]
    if len(free) < len(readings):
        raise _refused(
            "NVML does not report the slots' free memory, so another process's memory on a slot could not be seen",
            "set search.parallel: 1",
        )
    _check_free(first, free, target)
    return [f"cuda:{first + i}" for i in range(count)]


def _refused(reason: str, fix: str) -> SpecError:
    """A refusal of the slots: every one is a problem with the spec's ``search.parallel``, the reason and its fix."""
    return SpecError("search.parallel", [Problem("search.parallel", reason, fix)])


def _check_free(first: int, free: list[int], target: Target) -> None:
    """Refuse slots whose GPU has less free memory than needed (``free[i]``: cuda:``first + i``'s, the target's
    first): another process's memory there would run a trial out of memory sooner than on the target."""
    budget = target.info.memory_budget_bytes
    # Under a budget every slot, the target's too, needs the budget free: a card with less would run a trial out of
    # memory below the budget it emulates (a neighbour's memory is not taken off the budget's cap any more).
    need = budget if budget else free[0]
    short = [(first + i, f) for i, f in enumerate(free) if f < need - SLOT_FREE_TOLERANCE]
    if short:
        listed = ", ".join(f"cuda:{index} has {format_bytes(f)} free" for index, f in short)
        raise _refused(
            f"{listed}, the target {target.device} {format_bytes(free[0])}"
            + (f" (the budget is {format_bytes(budget)})" if budget else "")
            + ": another process holds memory there, and a trial in that slot would run out of memory sooner",
            "free those GPUs, make CUDA_VISIBLE_DEVICES name idle ones, or set search.parallel: 1",
        )


def search(runner: TrialRunner, limits: Limits, history: list[Observation], step: Step | None) -> Conclusion:
    """The edge search over real trials: ``run_search`` with one slot, rounds of trials with several."""
    from isoprobe.search.edge_search import run_search

    devices = resolve_slots(runner.spec, runner.target, runner.reporter.note)
    if len(devices) == 1:
        # The floor the trials so far measured (a command's heap churn) steers the next trial (issue 49).
        return run_search(
            runner.observe,
            limits,
            history,
            step=step,
            margin=lambda: limits.margin if (s := runner.spread(least=True)) is None else s.bytes,
        )
    from isoprobe.search.parallel import run_parallel_search

    runner.reporter.note(f"{len(devices)} slots: up to {len(devices)} trials at once ({', '.join(devices)})")
    found = run_parallel_search(
        lambda batches, observed, deciding=None: observe_round(runner, batches, devices, observed, deciding),
        limits,
        len(devices),
        history,
        step=step,
    )
    runner.reporter.note(f"edge search: {len(history)} trials in {found.rounds} rounds")
    return found.conclusion


@dataclass(frozen=True)
class _Slot:
    """What one slot of a round is asked: its purpose, and how long it steps (until steady; a cycle's wait)."""

    purpose: str
    rule: SteadyRule | None
    cycle: CycleRule | None


def observe_round(
    runner: TrialRunner,
    batches: list[int],
    devices: list[str],
    observed: Observed,
    deciding: list[bool] | None = None,
) -> None:
    """Run ``batches`` at once, slot ``i`` on ``devices[i]``; ``observed(slot, observation)`` as each trial ends.
    ``deciding[i]``: slot ``i`` steps until steady (``search.parallel.round_deciding``; a confirmation always does).

    Each trial joins ``runner.trials`` and is printed as its child ends (so its
    index is the order of the ends), and its observation goes to the search at
    once; only an ambiguous library error waits for its evidence, after the
    round, as ``TrialRunner.run`` would make it wait. A signal mid-round thus
    leaves every ended trial in the result and in what the search proved.
    """
    from isoprobe.executors.rounds import run_round

    budget = runner.target.info.memory_budget_bytes
    slots = [_round_slot(runner, batches, slot, deciding) for slot in range(len(batches))]
    jobs = _round_jobs(runner, batches, devices, slots, budget)
    ambiguous: list[tuple[int, Trial, str]] = []  # (slot, trial, its error's type)

    def finished(slot: int, run: ChildRun) -> None:
        asked = runner._asked(budget, rule=slots[slot].rule, cycle=slots[slot].cycle)
        trial = runner.record(run, batches[slot], slots[slot].purpose, asked)
        error = trial.error
        if (
            trial.outcome is Outcome.ERROR
            and error is not None
            and budget is not None
            and maybe_allocation_failure(error.message)
        ):
            ambiguous.append((slot, trial, error.type))  # counted once its evidence is in
        else:
            observed(slot, runner.observation(trial))

    run_round(runner.executor, jobs, finished)
    if budget is not None:  # only a trial under a budget waits for evidence
        _settle_ambiguous(runner, ambiguous, budget, observed)


def _round_slot(runner: TrialRunner, batches: list[int], slot: int, deciding: list[bool] | None) -> _Slot:
    """Slot ``slot``'s purpose, read off the trials before the round and the slots before it in the round: a
    batch's first run is a search trial, one after a crash or timeout a retry, any other a confirmation (the same
    batch twice in a round is one); a confirmation, or a slot the search marks deciding, steps until steady."""
    from isoprobe.pipeline.trials import _SEARCH_PURPOSES

    batch = batches[slot]
    earlier: list[Trial | None] = [t for t in runner.trials if t.batch_size == batch and t.purpose in _SEARCH_PURPOSES]
    earlier += [None] * batches[:slot].count(batch)  # the same batch twice in a round: a confirmation
    if not earlier:
        purpose = "search"
    elif (last := earlier[-1]) is not None and last.outcome in (Outcome.CRASHED, Outcome.TIMED_OUT):
        purpose = "retry"
    else:
        purpose = "confirmation"
    # it decides the maximum: until steady
    rule = runner.deciding_rule(batch) if purpose == "confirmation" or (deciding and deciding[slot]) else None
    return _Slot(purpose, rule, runner.cycle_rule if rule is not None else None)


def _round_jobs(
    runner: TrialRunner, batches: list[int], devices: list[str], slots: list[_Slot], budget: int | None
) -> list[tuple]:
    """The round's jobs for ``executors.rounds.run_round``: each slot's request on its own device, the probe's
    conditions (on CPU each child capped at the budget: the slots share one machine), its timeout and name."""
    conditions = runner.conditions
    if runner.target.backend == "cpu" and budget != conditions.memory_limit:
        conditions = replace(conditions, memory_limit=budget)
    first = len(runner.trials) + 1
    jobs = []
    for slot, (batch, asked) in enumerate(zip(batches, slots, strict=True)):
        rule, waits = asked.rule, asked.cycle
        request = TrialRequest(
            spec=runner.spec,
            batch_size=batch,
            device=devices[slot],
            memory_budget_bytes=budget,
            python_path=runner.python_path,
            steady=rule,
            cycle=waits,
            data_indices=request_indices(runner.target.data, batch),
        )
        jobs.append(
            (
                request,
                conditions,
                runner.timeout(max(rule.max_steps if rule else 0, waits.max_steps if waits else 0) or None),
                f"round{first:03d}-s{slot}-b{batch}",
            )
        )
    return jobs


def _settle_ambiguous(
    runner: TrialRunner, ambiguous: list[tuple[int, Trial, str]], budget: int, observed: Observed
) -> None:
    """The evidence an ambiguous library error needs, as ``TrialRunner.run`` gets it, one trial after another once
    the round ended: the batch again with more memory; a fit there makes the error an allocation failure. Each
    trial is observed only then, so the search never counts an error that was memory as something else."""
    for slot, trial, error_type in ambiguous:
        larger = runner._larger_budget(budget)
        check = runner._launch(trial.batch_size, "memory_check", larger)
        if check.outcome is Outcome.FITS:
            trial = runner._reclassify(
                trial,
                (
                    f"{error_type} under the budget, but batch {trial.batch_size} fit with more memory "
                    f"(trial {check.index}): an allocation failure"
                ),
            )
        observed(slot, runner.observation(trial))
