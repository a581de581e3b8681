"""Issue 35, 'each proof once': which trial steps until steady, what the maximum still needs, and when the
maximum's steady run proves the recommendation without a soak. Pure: no processes."""

from __future__ import annotations

from isoprobe.report.outcomes import Outcome
from isoprobe.search.edge_search import decides, plan_next, run_search
from isoprobe.search.history import Limits, Observation, proofs_due, verdicts
from isoprobe.search.parallel import round_deciding
from isoprobe.search.headroom import advise
from isoprobe.search.soak import proven_by_maximum

MiB = 1 << 20
STEADY = Limits(start=2, confirmations=0, steady=True)


def fit(batch: int, steady: bool = False) -> Observation:
    return Observation(batch, Outcome.FITS, 100 * MiB + batch * MiB, 100 * MiB, steady=steady)


def oom(batch: int, steady: bool = False) -> Observation:
    return Observation(batch, Outcome.OUT_OF_MEMORY, steady=steady)


def test_only_the_batch_that_would_be_the_maximum_steps_until_steady():
    history = [fit(8), oom(16)]
    assert decides(history, STEADY, 15)          # right below the smallest failure: a fit makes it the maximum
    assert not decides(history, STEADY, 12)      # a fit only moves the lower bound
    assert decides(history, STEADY, 8)           # the maximum run again
    assert not decides([fit(8)], STEADY, 16)     # nothing failed yet: no fit can be the answer
    assert decides([fit(8)], Limits(start=2, cap=16, steady=True), 16)  # the cap: a fit is the answer
    assert not decides(history, Limits(start=2), 15)  # without the steady rule no trial is asked to step on


def test_a_steady_fit_of_the_maximum_is_its_proof_and_a_short_one_needs_one_steady_run():
    assert plan_next([fit(8), oom(10), fit(9, steady=True)], STEADY) is None
    assert plan_next([fit(8), oom(10), fit(9)], STEADY) == 9  # its only fit was short: once more, steady
    assert plan_next([fit(8), oom(10), fit(9), fit(9, steady=True)], STEADY) is None
    confirmed = Limits(start=2, confirmations=1, steady=True)
    # A confirmation asked: one more run after the first fit (a short fit's steady re-run is both).
    assert plan_next([fit(8), oom(10), fit(9, steady=True)], confirmed) == 9
    assert plan_next([fit(8), oom(10), fit(9), fit(9, steady=True)], confirmed) is None
    judged = verdicts([fit(9), fit(9, steady=True)], STEADY)[9]
    assert (judged.fits_count, judged.steady_fits, proofs_due(judged, STEADY)) == (2, 1, 0)


def test_the_search_tells_the_oracle_which_trials_decide():
    asked = []

    def oracle(batch: int, deciding: bool) -> Observation:
        asked.append((batch, deciding))
        return fit(batch, deciding) if batch <= 20 else oom(batch, deciding)

    found = run_search(oracle, Limits(start=16, confirmations=0, steady=True))
    assert found.max_fitting == 20 and found.first_failing == 21
    assert sum(deciding for _, deciding in asked) >= 1
    steady_fits = [b for b, deciding in asked if deciding and b <= 20]
    assert steady_fits == [20]  # the one steady fit is the maximum's
    assert asked.count((20, True)) == 1  # and it ran once


def test_a_second_run_in_the_same_round_steps_until_steady():
    history = [fit(8), oom(16)]
    assert round_deciding(history, STEADY, [12, 15, 12]) == [False, True, True]


def test_a_batch_below_a_steady_maximum_is_proven_when_its_prediction_plus_the_growth_keeps_the_headroom():
    peaks = [900 * MiB, 950 * MiB, 952 * MiB, 956 * MiB, 960 * MiB, 960 * MiB, 960 * MiB]
    proof = proven_by_maximum(30, 40, peaks, 2, 800 * MiB, 810 * MiB)
    assert proof is not None and proof.growth_bytes == 10 * MiB and proof.predicted_bytes == 800 * MiB
    assert proven_by_maximum(30, 40, peaks, 2, 804 * MiB, 810 * MiB) is None  # 804 + 10 > 810: soak it
    assert proven_by_maximum(40, 40, peaks, 2, 800 * MiB, 810 * MiB) is None  # not below the maximum
    assert proven_by_maximum(30, 40, peaks, 2, None, 810 * MiB) is None      # no prediction
    assert proven_by_maximum(30, 40, peaks[:1], 2, 800 * MiB, 810 * MiB) is None  # too few readings
    # A rise a soak would call noise (2 MiB, under 4.8) is no growth (issue 56): 809 + 0 stays within 810.
    quiet = [900 * MiB, 950 * MiB, 952 * MiB] + [952 * MiB] * 4
    assert proven_by_maximum(30, 40, quiet, 2, 809 * MiB, 810 * MiB).growth_bytes == 0


def test_one_fitting_batch_and_its_base_reading_give_the_recommendation_a_line():
    """An exact estimate proves the edge with one fitting trial: without its base reading there is no line and
    the headroom was not applied (the recommendation was the maximum)."""
    capacity = 1000 * MiB
    alone = advise(40, [(40, 900 * MiB)], capacity, 0.2, 1)
    assert alone.line is None and "headroom not applied" in alone.note and alone.batch_size == 39
    anchored = advise(40, [(40, 900 * MiB)], capacity, 0.2, 1, anchor=(40, 500 * MiB))
    # 10 MiB a sample from 500 MiB: the target 800 MiB holds 30.
    assert anchored.batch_size == 30 and anchored.predicted_peak_bytes == 800 * MiB
    assert "base reading" in anchored.note


def test_a_stretched_timeout_is_earned_step_by_step():
    """The deciding trial runs until steady from its first run, so its timeout is stretched for up to 30 steps; a
    trial that hangs at its first step must still be stopped at search.trial_timeout (issue 35: it waited 15 of
    them, 120 s for an 8 s timeout, in tests/integration/test_faults.py)."""
    from isoprobe.executors.rounds import earned_timeout
    from isoprobe.protocol.messages import InspectRequest, TrialRequest
    from isoprobe.spec.model import Spec

    spec = Spec.model_validate({"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 32, 32]},
                                "target": {"classes": 10}, "search": {"steps": 2, "trial_timeout": 8}})
    request = TrialRequest(spec=spec, batch_size=8, device="cpu")
    stretched = 120.0  # TrialRunner.timeout for 30 steps of a search of 2
    assert earned_timeout(request, stretched, 0) == 8      # hung before its first step: the trial timeout
    assert earned_timeout(request, stretched, 1) == 12     # each step earns a search step's share (8 / 2)
    assert earned_timeout(request, stretched, 10) == 48
    assert earned_timeout(request, stretched, 29) == 120   # never more than the stretch
    assert earned_timeout(request, 8, 0) == 8              # a short trial: its timeout as it is
    inspect = InspectRequest(spec=spec)
    assert earned_timeout(inspect, 30, 0) == 30


def test_a_deciding_trial_whose_peak_reaches_the_margin_stops_there_and_is_marginal():
    """Issue 35: the deciding trial of a batch that turns out marginal ran until steady (7 steps, 28 s on the
    benchmark's convnet) to be ruled out by a peak it had reached at its third step."""
    from isoprobe.report import steady

    rule = steady.SteadyRule(min_steps=3, max_steps=30, stop_at_bytes=1000)
    assert not steady.should_stop([990, 995], rule)          # before the minimum steps: on
    assert steady.should_stop([990, 995, 1000], rule)        # at the margin after them: done
    assert not steady.should_stop([990, 995, 999], rule)     # below it and still rising: on
    assert not steady.should_stop([990, 995, 1000], rule.model_copy(update={"stop_at_bytes": None}))
