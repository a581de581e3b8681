"""The plan of gradient accumulation and the world size from the launcher: plain functions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isoprobe.search.plan import STEPS_BOUND_FACTOR, Plan, plan_accumulation
from isoprobe.spec.job import world_size_from_environment


def assert_consistent(plan: Plan) -> None:
    assert plan.global_batch_size == plan.micro_batch_size * plan.accumulation_steps * plan.world_size
    assert plan.difference == plan.global_batch_size - plan.target_global_batch
    assert plan.accumulation_steps >= 1


# --------------------------------------------------------------------------- exact plans


def test_divisible_target_on_one_rank_takes_the_fewest_exact_steps():
    # a0 = ceil(1000 / 21) = 48; 48 and 49 do not divide 1000, 50 does.
    plan = plan_accumulation(1000, world_size=1, max_micro_batch=21)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.world_size) == (20, 50, 1)
    assert plan.global_batch_size == 1000
    assert plan.difference == 0
    assert plan.note == "exact: 20 x 50 steps x 1 rank = 1000"
    assert_consistent(plan)


def test_world_size_divides_the_target_between_ranks():
    # 128 per rank, a0 = ceil(128 / 21) = 7; 7 does not divide 128, 8 does.
    plan = plan_accumulation(1024, world_size=8, max_micro_batch=21)
    assert (plan.micro_batch_size, plan.accumulation_steps) == (16, 8)
    assert plan.difference == 0
    assert plan.note == "exact: 16 x 8 steps x 8 ranks = 1024"


def test_target_that_fits_in_one_micro_batch_needs_no_accumulation():
    plan = plan_accumulation(64, world_size=2, max_micro_batch=32)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.difference) == (32, 1, 0)
    assert plan.note == "exact: 32 x 1 step x 2 ranks = 64"


def test_fewest_steps_wins_among_exact_plans():
    # 96 = 24 x 4 = 16 x 6 = 12 x 8: a0 = 4 and 4 steps is exact.
    plan = plan_accumulation(96, world_size=1, max_micro_batch=24)
    assert (plan.micro_batch_size, plan.accumulation_steps) == (24, 4)


def test_an_exact_plan_beyond_the_steps_bound_is_not_taken():
    # 1009 is prime: the only exact plan on one rank is 1 x 1009 steps, far past 2 * a0 = 98.
    plan = plan_accumulation(1009, world_size=1, max_micro_batch=21)
    assert plan.difference != 0
    assert plan.accumulation_steps <= STEPS_BOUND_FACTOR * 49


# --------------------------------------------------------------------------- nearest plans


def test_prime_target_gets_the_nearest_plan_with_its_difference_stated():
    # a0 = ceil(1009 / 21) = 49, so steps in [49, 98]: 49 x 21 = 1029 (+20), 50 x 20 = 1000 (-9),
    # 53 x 19 = 1007 (-2), 56 x 18 = 1008 (-1), 63 x 16 = 1008 (-1); no +1 plan in the bound.
    plan = plan_accumulation(1009, world_size=1, max_micro_batch=21)
    assert plan.micro_batch_size <= 21
    assert_consistent(plan)
    # the two -1 plans tie on |difference|: fewer steps wins, 18 x 56
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.difference) == (18, 56, -1)
    assert "1009 is not reachable exactly" in plan.note
    assert "nearest 1008 (-1)" in plan.note
    assert "18 x 56 steps x 1 rank = 1008" in plan.note


def test_fewer_steps_beat_the_direction_of_the_difference():
    # 17 on one rank, max 5: a0 = 4, steps in [4, 8]. 4 x 4 = 16 (-1) and 3 x 6 = 18 (+1) are
    # equally near; the one with fewer steps wins even though it lands below the target.
    plan = plan_accumulation(17, world_size=1, max_micro_batch=5)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.difference) == (4, 4, -1)


def test_equally_near_globals_with_the_same_steps_go_up():
    # 13 on one rank, max 10: a0 = 2, steps in [2, 4]; 13 is prime, so nothing is exact.
    # At two steps 6 x 2 = 12 (-1) and 7 x 2 = 14 (+1) are equally near: the plan goes up.
    plan = plan_accumulation(13, world_size=1, max_micro_batch=10)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.difference) == (7, 2, 1)
    assert "nearest 14 (+1)" in plan.note


def test_a_micro_batch_floor_can_force_overshooting():
    # 10 on one rank with micro-batches of exactly 4: steps in [3, 6], nearest is 4 x 3 = 12 (+2).
    plan = plan_accumulation(10, world_size=1, max_micro_batch=4, min_micro_batch=4)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.difference) == (4, 3, 2)
    assert "micro-batches of 4..4 in 3..6 steps" in plan.note


def test_target_not_divisible_by_world_size_is_never_exact():
    plan = plan_accumulation(1001, world_size=8, max_micro_batch=32)
    assert plan.difference != 0
    assert plan.global_batch_size % 8 == 0
    # the multiples of 8 nearest 1001 are 1000 (-1) and 1008 (+7): 1000 = 25 x 5 steps x 8
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.difference) == (25, 5, -1)
    assert plan.note.startswith("1001 is not a multiple of 8 ranks; nearest 1000 (-1)")


def test_target_below_one_micro_batch_per_rank_gives_the_smallest_plan():
    plan = plan_accumulation(3, world_size=4, max_micro_batch=16)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.difference) == (1, 1, 1)
    plan = plan_accumulation(5, world_size=4, max_micro_batch=16, min_micro_batch=2)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.difference) == (2, 1, 3)
    assert plan.global_batch_size == 8
    assert "below one micro-batch of 2 on each of 4 ranks" in plan.note
    assert "(+3)" in plan.note


# --------------------------------------------------------------------------- limits


def test_min_micro_batch_is_honoured():
    # 7 on one rank with max 8 would be 7 x 1; a floor of 8 forces 8 x 1 (+1).
    plan = plan_accumulation(7, world_size=1, max_micro_batch=8, min_micro_batch=8)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.difference) == (8, 1, 1)
    # BatchNorm floor of 2: 99 with max 3 -> a0 = 33, 3 x 33 = 99 exact.
    plan = plan_accumulation(99, world_size=1, max_micro_batch=3, min_micro_batch=2)
    assert plan.micro_batch_size >= 2
    assert plan.difference == 0


def test_micro_batch_never_exceeds_the_maximum():
    for target in range(1, 300):
        plan = plan_accumulation(target, world_size=3, max_micro_batch=7, min_micro_batch=2)
        assert 2 <= plan.micro_batch_size <= 7
        assert_consistent(plan)


@pytest.mark.parametrize(
    "target,world,max_micro,min_micro",
    [
        (0, 1, 8, 1),
        (100, 0, 8, 1),
        (100, 1, 0, 1),
        (100, 1, 8, 0),
        (-5, 1, 8, 1),
        (100, 1, 2, 4),
    ],
)
def test_impossible_arguments_give_none(target, world, max_micro, min_micro):
    assert plan_accumulation(target, world, max_micro, min_micro) is None


def test_plan_is_frozen():
    plan = plan_accumulation(100, 1, 10)
    with pytest.raises(AttributeError):
        plan.micro_batch_size = 5  # type: ignore[misc]


def test_huge_fewest_steps_stays_quick_when_exact_at_once():
    plan = plan_accumulation(10**7, world_size=1, max_micro_batch=1)
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.difference) == (1, 10**7, 0)


# --------------------------------------------------------------------------- property


def brute_force_plans(target, world, max_micro, min_micro):
    """Every (micro, steps) with steps in [a0, 2 a0] and micro in [min, max]: the oracle."""
    fewest = -(-target // (world * max_micro))
    return [
        (micro, steps)
        for steps in range(fewest, STEPS_BOUND_FACTOR * fewest + 1)
        for micro in range(min_micro, max_micro + 1)
    ]


@st.composite
def plan_arguments(draw):
    world = draw(st.integers(1, 16))
    max_micro = draw(st.integers(1, 64))
    min_micro = draw(st.integers(1, max_micro))
    target = draw(st.integers(1, 3000))
    return target, world, max_micro, min_micro


@settings(max_examples=300, deadline=None)
@given(plan_arguments())
def test_plan_is_the_best_within_the_bound(arguments):
    target, world, max_micro, min_micro = arguments
    plan = plan_accumulation(target, world, max_micro, min_micro)

    assert min_micro <= plan.micro_batch_size <= max_micro
    assert plan.world_size == world
    assert_consistent(plan)

    candidates = brute_force_plans(target, world, max_micro, min_micro)
    assert (plan.micro_batch_size, plan.accumulation_steps) in candidates
    differences = [micro * steps * world - target for micro, steps in candidates]
    nearest = min(abs(d) for d in differences)
    assert abs(plan.difference) == nearest

    exact_steps = [steps for (micro, steps), d in zip(candidates, differences) if d == 0]
    if exact_steps:
        assert plan.difference == 0
        assert plan.accumulation_steps == min(exact_steps)
        assert plan.note.startswith("exact: ")
    else:
        assert plan.difference != 0
        assert f"({plan.difference:+d})" in plan.note

    # the tie-break: among the nearest, fewest steps, then at or above the target
    nearest_keys = sorted(
        (steps, d < 0) for (micro, steps), d in zip(candidates, differences) if abs(d) == nearest
    )
    assert (plan.accumulation_steps, plan.difference < 0) == nearest_keys[0]


# --------------------------------------------------------------------------- world size


@pytest.mark.parametrize(
    "environ,expected",
    [
        ({}, None),
        ({"WORLD_SIZE": "8"}, (8, "WORLD_SIZE")),
        ({"WORLD_SIZE": " 4\n"}, (4, "WORLD_SIZE")),
        ({"WORLD_SIZE": "4", "SLURM_NTASKS": "16"}, (4, "WORLD_SIZE")),
        ({"SLURM_NTASKS": "16"}, (16, "SLURM_NTASKS")),
        ({"WORLD_SIZE": "0", "SLURM_NTASKS": "16"}, (16, "SLURM_NTASKS")),
        ({"WORLD_SIZE": "", "SLURM_NTASKS": "2"}, (2, "SLURM_NTASKS")),
        (
            {"SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "4"},
            (8, "SLURM_NNODES x SLURM_NTASKS_PER_NODE"),
        ),
        (
            {"SLURM_NTASKS": "abc", "SLURM_NNODES": "3", "SLURM_NTASKS_PER_NODE": "2"},
            (6, "SLURM_NNODES x SLURM_NTASKS_PER_NODE"),
        ),
        ({"SLURM_NNODES": "2"}, None),
        ({"SLURM_NTASKS_PER_NODE": "4"}, None),
        ({"SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "4(x2)"}, None),
        ({"WORLD_SIZE": "-2"}, None),
        ({"WORLD_SIZE": "+2"}, None),
        ({"WORLD_SIZE": "2.0"}, None),
        ({"WORLD_SIZE": "1_0"}, None),
        ({"WORLD_SIZE": "\u0663"}, None),  # an Arabic-Indic digit: int() takes it, we do not
        ({"WORLD_SIZE": "1"}, (1, "WORLD_SIZE")),
    ],
)
def test_world_size_from_environment(environ, expected):
    assert world_size_from_environment(environ) == expected
