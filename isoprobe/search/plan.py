"""From the recommended batch to a training plan: micro-batch x accumulation steps x ranks.

The probe answers "how large a batch fits on one device". Users usually start
from the other end: a global batch their hyperparameters were tuned for (say
1000), trained on some number of ranks. This module turns the two into a plan
of gradient accumulation, ``micro_batch_size x accumulation_steps x world_size``,
whose micro-batch never exceeds the recommendation, so memory stays inside the
headroom the probe measured.

Pure arithmetic: no torch, no I/O beyond reading the mapping it is handed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from isoprobe.spec.job import world_size_from_environment

# An exact plan, or the nearest one, may use at most this many times the fewest
# steps that could reach the target. At the bound the micro-batch is about
# 1/STEPS_BOUND_FACTOR of the recommended one; smaller micro-batches leave the
# device underused and pay the per-step overhead more often, which costs more
# than a global batch a few samples off the target (and the difference is stated).
STEPS_BOUND_FACTOR = 2


@dataclass(frozen=True)
class Plan:
    micro_batch_size: int
    accumulation_steps: int
    world_size: int
    global_batch_size: int  # micro_batch_size * accumulation_steps * world_size
    target_global_batch: int
    difference: int  # global_batch_size - target_global_batch; 0 when exact
    note: str  # one sentence for people


def plan_accumulation(
    target_global_batch: int,
    world_size: int,
    max_micro_batch: int,
    min_micro_batch: int = 1,
) -> Plan | None:
    """The plan of accumulation that reaches ``target_global_batch``, or comes nearest to it.

    Rules, and why:

    - ``max_micro_batch`` is the recommended batch per rank (the one with
      headroom); the micro-batch never exceeds it, because above it memory is
      no longer what the probe measured. ``min_micro_batch`` is a floor, e.g. 2
      for BatchNorm, which cannot normalise over a single sample.
    - None when any argument is below 1 or ``max_micro_batch < min_micro_batch``:
      no plan honours both limits.
    - ``a0 = ceil(target / (world_size * max_micro_batch))`` is the fewest steps
      that could reach the target (for a target divisible by ``world_size``
      that is ``ceil(per_rank_target / max_micro_batch)``). Only steps in
      ``[a0, STEPS_BOUND_FACTOR * a0]`` are considered: being exact is not worth
      an absurd number of tiny micro-batches.
    - Among those plans, with micro-batches in ``[min, max]``, the one chosen
      has the smallest ``|global - target|``, so an exact plan wins whenever one
      exists in the bound; then the fewest steps, because larger micro-batches
      run faster; then, between two equally near globals, the one at or above
      the target. Why above: the target is the batch the hyperparameters were
      tuned for, usually a floor for gradient noise, and since the micro-batch
      stays within ``max`` either side costs no memory; the difference is
      stated in ``note`` either way, so nothing changes silently.
    - A target that is not a multiple of ``world_size`` cannot be exact (every
      rank runs the same micro-batch and steps); the nearest plan is returned.
    - A target below ``world_size * min_micro_batch`` gives the smallest plan,
      ``min`` x 1 step, with its positive difference stated.
    """
    if min(target_global_batch, world_size, max_micro_batch, min_micro_batch) < 1:
        return None
    if max_micro_batch < min_micro_batch:
        return None
    fewest = fewest_steps(target_global_batch, world_size, max_micro_batch)
    micro, steps = nearest_micro_and_steps(
        target_global_batch,
        world_size,
        min_micro_batch,
        max_micro_batch,
        range(fewest, STEPS_BOUND_FACTOR * fewest + 1),
    )
    global_batch = micro * steps * world_size
    return Plan(
        micro_batch_size=micro,
        accumulation_steps=steps,
        world_size=world_size,
        global_batch_size=global_batch,
        target_global_batch=target_global_batch,
        difference=global_batch - target_global_batch,
        note=describe(target_global_batch, micro, steps, world_size, min_micro_batch, max_micro_batch, fewest),
    )


def fewest_steps(target_global_batch: int, world_size: int, max_micro_batch: int) -> int:
    """``ceil(target / (world_size * max))``: with fewer steps even full micro-batches fall short."""
    return -(-target_global_batch // (world_size * max_micro_batch))


def nearest_micro_and_steps(
    target: int, world_size: int, min_micro: int, max_micro: int, steps_range: range
) -> tuple[int, int]:
    """The (micro, steps) minimising ``(|global - target|, steps, global below target)``.

    For a given number of steps the globals reachable are the multiples of
    ``steps * world_size`` between the micro-batch limits, so only the two
    micro-batches either side of ``target / (steps * world_size)`` can be
    nearest. Steps are scanned in increasing order, and the scan stops at an
    exact plan (nothing beats it later) or once even the smallest micro-batch
    overshoots by more than the best difference so far (it only grows).
    The cost is at most ``a0`` iterations: instant for real targets, about a
    second for a million-sample target with micro-batches of 2.
    """
    best_key: tuple[int, int, bool] | None = None
    best = (min_micro, steps_range.start)
    for steps in steps_range:
        samples_per_micro = steps * world_size
        if best_key is not None and min_micro * samples_per_micro - target > best_key[0]:
            break
        for micro in micro_candidates(target, samples_per_micro, min_micro, max_micro):
            difference = micro * samples_per_micro - target
            key = (abs(difference), steps, difference < 0)
            if best_key is None or key < best_key:
                best_key, best = key, (micro, steps)
        if best_key is not None and best_key[0] == 0:
            break
    return best


def micro_candidates(target: int, samples_per_micro: int, min_micro: int, max_micro: int) -> set[int]:
    """The micro-batches, within the limits, just below and just above ``target / samples_per_micro``."""
    below = target // samples_per_micro
    return {clamp(below, min_micro, max_micro), clamp(below + 1, min_micro, max_micro)}


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def describe(
    target: int,
    micro: int,
    steps: int,
    world_size: int,
    min_micro: int,
    max_micro: int,
    fewest: int,
) -> str:
    """One sentence: the plan, and when it is not exact, why and by how much."""
    global_batch = micro * steps * world_size
    recipe = f"{micro} x {plural(steps, 'step')} x {plural(world_size, 'rank')} = {global_batch}"
    if global_batch == target:
        return f"exact: {recipe}"
    difference = f"{global_batch - target:+d}"
    if target < world_size * min_micro:
        return (
            f"{target} is below one micro-batch of {min_micro} on each of "
            f"{plural(world_size, 'rank')}; smallest plan {recipe} ({difference})"
        )
    if target % world_size:
        why = f"{target} is not a multiple of {plural(world_size, 'rank')}"
    else:
        why = (
            f"{target} is not reachable exactly with micro-batches of {min_micro}..{max_micro} "
            f"in {fewest}..{STEPS_BOUND_FACTOR * fewest} steps on {plural(world_size, 'rank')}"
        )
    return f"{why}; nearest {global_batch} ({difference}): {recipe}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def micro_batch_ceiling(recommended: int | None, maximum: int | None, soaked: bool) -> int | None:
    """The largest micro-batch a plan may use: the recommendation, else the maximum, unless soaks ran
    and none survived (memory grows from step to step): then no batch is safe to plan with."""
    if recommended is not None:
        return recommended
    return None if soaked else maximum


def accumulation_plan(spec, largest: int | None, environ: Mapping[str, str]):
    """The result's ``accumulation`` block for ``spec.plan``, or None: micro-batches up to ``largest``.

    Separate from the probe because the world size may come from the environment
    (WORLD_SIZE, SLURM_NTASKS): an answer read from the cache is re-planned for the
    job that asks, not for the one that probed.
    """
    from isoprobe.report.recommendation import AccumulationPlan

    target = spec.plan.target_global_batch
    if target is None or largest is None:
        return None
    if spec.plan.world_size is not None:
        world, source = spec.plan.world_size, "spec"
    else:
        gang = spec.distributed.world_size if spec.distributed.gang else None
        world, source = world_size_from_environment(environ) or (
            (gang, "distributed.world_size") if gang else (1, "default")
        )
    plan = plan_accumulation(target, world, largest, min(spec.search.start_batch_size, largest))
    if plan is None:
        return None
    return AccumulationPlan(
        target_global_batch=target,
        world_size=world,
        world_size_source=source,
        micro_batch_size=plan.micro_batch_size,
        accumulation_steps=plan.accumulation_steps,
        global_batch_size=plan.global_batch_size,
        difference=plan.difference,
        note=plan.note,
    )
