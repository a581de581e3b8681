"""One spec, one recommendation (issue 56 item 3): the choice is a pure function of the maximum and what the trials
measured near it, whatever order they ran in, whichever small batches the search's path visited, and whatever noise
below the decision's tolerance their readings carry.

The figures are two real probes of one spec (small-cnn, a DDP gang of 2 ranks, gloo, 1 GiB a rank, headroom 0.1,
multiple_of 8; the shape of the two-node gang that answered 58 every time and recommended 16 or 24): both answered
58; in the second, batches 2, 4 and 13 all read 895.5 MiB (a floor no batch sets: an address-space reservation
that lifted VmPeak in that run only; batch 2 read 844.4 MiB in the first run), and the least-squares line through
every fitting trial, flattened by that floor, predicted 24 at 934.8 MiB, over the 921.6 MiB target: 16.
"""

from __future__ import annotations

import itertools
import random

import pytest

from isoprobe.search.headroom import advise, line_points, recommendation_line
from isoprobe.search.soak import judge, proven_by_maximum, rise_noise_bytes

MiB = 1 << 20
CAPACITY, HEADROOM, MULTIPLE = 1 << 30, 0.1, 8
TARGET = CAPACITY - int(HEADROOM * CAPACITY)

#: (batch, budget peak) of every fitting trial, in the order they ran; 59 fit inside the spread (not the maximum).
PLAIN_RUN = [(2, 885383168), (30, 974798848), (59, 1067479040), (58, 1064312832)]
FLOOR_RUN = [(2, 938999808), (4, 938995712), (13, 938995712), (41, 1009917952), (59, 1067393024),
             (50, 1038680064), (54, 1051512832), (56, 1057832960), (57, 1061007360), (58, 1064247296)]
#: A run on two Slurm nodes (one rank each): 2 read the floor (rank 1's 895.1 MiB), 4 did not; 59 and 60 fit
#: inside the spread. Only the maximum lies from half of it up, so the line reaches below.
TWO_NODE_RUN = [(2, 938577920), (4, 891273216), (60, 1070346240), (58, 1064054784), (59, 1067077632)]
#: The maximum's base reading (its data segment after the steps), in each run.
PLAIN_ANCHOR, FLOOR_ANCHOR = (58, 881836032), (58, 881770496)
#: The maximum's long run (7 steps until steady), its running peak after each step.
MAX_PEAKS = [1062830080, 1064288256, 1064288256, 1064288256, 1064312832, 1064312832, 1064312832]


def _advise(fitting, anchor=None, maximum=58):
    return advise(maximum, fitting, CAPACITY, HEADROOM, MULTIPLE, anchor=anchor)


def test_a_floor_under_the_small_batches_does_not_move_the_recommendation():
    """The 16-vs-24 flip: the same maximum, the same peaks near it, a floor under the small batches in one run.
    Before issue 56's fix the floor run recommended 16 (its line: 2.23 MiB a sample from 881 MiB)."""
    plain, floored = _advise(PLAIN_RUN, PLAIN_ANCHOR), _advise(FLOOR_RUN, FLOOR_ANCHOR)
    assert plain.batch_size == floored.batch_size == 24, (plain.note, floored.note)
    assert plain.decided_by == floored.decided_by == "line"
    # Both lines are the activations' cost near the maximum: 3.05 MiB a sample, within 0.01 MiB of each other.
    assert abs(plain.line.slope - floored.line.slope) < 0.01 * MiB
    assert abs(plain.predicted_peak_bytes - floored.predicted_peak_bytes) < MiB
    assert floored.line_batches == (58, 57, 56, 54, 50, 41)  # from half the maximum up; 59 is above it
    assert plain.line_batches == (58, 30)


def test_the_line_goes_through_the_batches_from_half_the_maximum_up_one_point_a_batch():
    points = [(2, 900), (20, 1000), (30, 1100), (30, 1105), (40, 1200), (41, 1300)]
    assert line_points(points, 40) == [(40, 1200), (30, 1105), (20, 1000)]  # 41 is above the maximum
    # One batch from half the maximum up: it and the batch below with the steepest line to it (a floor only lifts a
    # reading, so the least lifted one): 8, not 2, whose 1000 sits on a floor.
    assert line_points([(2, 1000), (8, 960), (40, 1200)], 40) == [(40, 1200), (8, 960)]
    assert line_points([(2, 900), (8, 960), (40, 1200)], 40) == [(40, 1200), (2, 900)]
    line, chosen = recommendation_line([(40, 1200)], 40, anchor=(40, 800))
    assert chosen == [(40, 1200)] and line.points == 1 and line.slope == 10  # one batch: from its base reading


def test_a_path_with_only_the_maximum_near_it_takes_the_least_lifted_small_batch():
    """The two-node path 2, 4, 60, 58, 59: the line through 58 and the least lifted of 2 and 4 (4) recommends 24;
    through 58 and 2 (the floor) it would have recommended 16."""
    advice = _advise(TWO_NODE_RUN, (58, 881577984))
    assert advice.batch_size == 24 and advice.line_batches == (58, 4), advice.note
    assert "reaches down to 4" in advice.note and "may recommend more" in advice.note


def test_a_path_whose_only_small_batch_sat_on_the_floor_says_why_it_recommends_less():
    """Where the path measured no batch near the maximum and its one small batch read the floor, the line is the
    only evidence there is and it predicts high: 8, and the note says that another path may recommend more."""
    advice = _advise([(2, 938577920), (58, 1064054784)], (58, 881577984))
    assert advice.batch_size == 8 and advice.decided_by == "line"
    assert "reaches down to 2" in advice.note and "may recommend more" in advice.note


@pytest.mark.parametrize("run, anchor", [(PLAIN_RUN, PLAIN_ANCHOR), (FLOOR_RUN, FLOOR_ANCHOR),
                                         (TWO_NODE_RUN, (58, 881577984))], ids=["plain", "floor", "two-node"])
def test_the_same_trials_in_any_order_with_jitter_below_the_tolerance_give_the_same_recommendation(run, anchor):
    """Trials reordered (a parallel search finishes them in any order), run again (a confirmation at the
    maximum), and every reading moved by up to half a MiB (what a fresh process's reading moves by): one answer."""
    expected = _advise(run, anchor)
    rng = random.Random(56)
    orders = list(itertools.islice(itertools.permutations(run), 40)) + [tuple(reversed(run))]
    for order in orders:
        jittered = [(b, p + rng.randint(-MiB // 2, MiB // 2)) for b, p in order]
        again = jittered + [(58, dict(run)[58] + rng.randint(-MiB // 2, MiB // 2))]
        for fitting in (list(order), jittered, again):
            advice = _advise(fitting, (anchor[0], anchor[1] + rng.randint(-MiB // 2, MiB // 2)))
            assert (advice.batch_size, advice.decided_by) == (expected.batch_size, expected.decided_by), advice.note


def test_which_small_batches_the_path_measured_does_not_matter():
    """Every subset of the small batches (below half the maximum), with or without the floor, the same choice."""
    near = [(b, p) for b, p in FLOOR_RUN if b >= 29]
    small = [(2, 885383168), (4, 891000000), (13, 938995712), (16, 938999808), (30, 974798848)]
    for size in range(len(small) + 1):
        for subset in itertools.combinations(small, size):
            assert _advise(near + list(subset), FLOOR_ANCHOR).batch_size == 24


def test_a_borderline_choice_says_so():
    """A target within the readings' movement of a candidate's predicted peak: the note says another run may
    recommend the next candidate, so two runs that differ are explained by their own results."""
    line = [(40, 1000 * MiB), (50, 1100 * MiB)]  # 600 MiB + 10 MiB a sample: 24 at 840 MiB, 32 at 920 MiB
    advice = advise(50, line, capacity=1000 * MiB, headroom=160 * MiB - MiB // 2, multiple_of=8)  # 24: 0.5 MiB in
    assert advice.batch_size == 24 and "borderline" in advice.note and "may recommend 16" in advice.note
    clear = advise(50, line, capacity=1000 * MiB, headroom=155 * MiB, multiple_of=8)  # 24 is 5 MiB inside
    assert clear.batch_size == 24 and "borderline" not in clear.note
    over = advise(50, line, capacity=1000 * MiB, headroom=80 * MiB + MiB // 2, multiple_of=8)  # 32: 0.5 MiB over
    assert over.batch_size == 24 and "may recommend 32" in over.note


def test_what_decided_the_batch_is_named():
    assert _advise([(58, 900 * MiB)]).decided_by == "no_line"  # one batch, no base reading
    on_line = advise(12, [(2, 1000 * MiB), (10, 1200 * MiB), (12, 1220 * MiB)], 1536 * MiB, 0.2, 1)
    assert on_line.batch_size == 12 and on_line.decided_by == "line"
    # The line says 12 (at 1214 of the 1229 target); 11 measured 1240: memory rises with the batch, so 10.
    held = advise(12, [(6, 900), (10, 1000), (11, 1240)], capacity=1536, headroom=0.2, multiple_of=1)
    assert held.batch_size == 10 and held.decided_by == "measured_over"
    # The line through scattered points says 11 (12 at 1269); 12 measured 1225, within the 1229 target.
    lifted = advise(12, [(6, 900), (10, 1220), (12, 1225)], capacity=1536, headroom=0.2, multiple_of=1)
    assert lifted.batch_size == 12 and lifted.decided_by == "measured_within"
    assert advise(4, [(2, 100), (4, 110)], capacity=150, headroom=0.5, multiple_of=1).decided_by == \
        "headroom_unreachable"


# --------------------------------------------------------------------------- the maximum's growth


def test_growth_within_the_noise_is_no_growth_for_the_proof_by_the_maximum():
    """The maximum grew 24 KiB after step 2 in one run and might grow 3 MiB in another: below the rise a soak
    would call noise (``rise_noise_bytes``), neither decides whether a soak runs."""
    predicted = 911 * MiB
    assert rise_noise_bytes(MAX_PEAKS[-1]) >= 4 * MiB
    for growth in (0, 24 << 10, 3 * MiB, rise_noise_bytes(MAX_PEAKS[-1]) - MiB):
        peaks = MAX_PEAKS[:-1] + [MAX_PEAKS[-1] + growth]
        proof = proven_by_maximum(24, 58, peaks, 2, predicted, predicted + MiB)
        assert proof is not None and proof.growth_bytes == 0, growth
    grown = MAX_PEAKS[:-1] + [MAX_PEAKS[-1] + 12 * MiB]
    assert proven_by_maximum(24, 58, grown, 2, predicted, TARGET) is None  # 911 + 12.0 MiB > 921.6: soak it


def test_the_soak_and_the_proof_call_the_same_rise_noise():
    peaks = [900 * MiB, 901 * MiB] + [901 * MiB + k * (MiB // 2) for k in range(1, 5)]  # +2 MiB over the tail
    assert not judge(True, 6, peaks, 800 * MiB).still_rising
    assert proven_by_maximum(10, 20, peaks, 2, 790 * MiB, 795 * MiB).growth_bytes == 0
