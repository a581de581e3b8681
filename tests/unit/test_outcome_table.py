"""``report.outcomes.MEANINGS``: one declaration of what each outcome means (issue 58 item 2).

Every site that decides on an outcome (the search's verdicts and bounds, its conclusion, the classification, the
messages, the plot, the exit codes) reads this table. These tests fail when an ``Outcome`` member lacks an entry or
any part of one, and pin the facts the table must keep consistent with each other.
"""

from __future__ import annotations

import dataclasses

import pytest

from isoprobe.errors import ExitCode
from isoprobe.report.outcomes import MEANINGS, Meaning, Outcome, PlotStyle, StopReason
from isoprobe.report.result import exit_code_for
from isoprobe.search.history import Limits, Observation, verdicts

FAILURES = [o for o in Outcome if not o.meaning.fits]


def test_every_outcome_has_an_entry_and_nothing_else_does():
    assert set(MEANINGS) == set(Outcome)


@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_entry_is_complete(outcome):
    meaning = MEANINGS[outcome]
    assert isinstance(meaning, Meaning) and outcome.meaning is meaning
    for field in dataclasses.fields(Meaning):
        if field.name not in ("precedence", "stop"):  # None is a value there (see below)
            assert getattr(meaning, field.name) is not None, field.name
    assert isinstance(meaning.exit_code, ExitCode)
    assert isinstance(meaning.plot, PlotStyle) and meaning.plot.marker and meaning.plot.colour and meaning.plot.label
    assert meaning.prose.strip()


def test_only_fits_fits():
    assert [o for o in Outcome if o.meaning.fits] == [Outcome.FITS]
    fits = Outcome.FITS.meaning
    assert fits.stop is None and fits.precedence is None and fits.exit_code is ExitCode.ANSWERED
    assert not (fits.memory_verdict or fits.stops_search or fits.retried or fits.must_reproduce)


@pytest.mark.parametrize("outcome", FAILURES)
def test_every_failure_is_either_retried_or_decisive(outcome):
    """A failure class that is not retried needs a precedence, or ``history.verdicts`` could not order it (before
    the table, a new class fell silently into the crash/timeout retry branch)."""
    meaning = outcome.meaning
    assert (meaning.precedence is None) == meaning.retried
    assert meaning.stop is not None, "a search that ends on it needs a stop reason"
    assert exit_code_for(meaning.stop) is meaning.exit_code
    assert not (meaning.memory_verdict and meaning.stops_search)


def test_precedences_and_stops_are_unique():
    precedences = [o.meaning.precedence for o in FAILURES if o.meaning.precedence is not None]
    assert len(set(precedences)) == len(precedences)
    stops = [o.meaning.stop for o in FAILURES]
    assert len(set(stops)) == len(stops)


def test_plot_styles_are_told_apart():
    styles = [(o.meaning.plot.marker, o.meaning.plot.colour) for o in Outcome]
    assert len(set(styles)) == len(styles)
    assert len({o.meaning.plot.label for o in Outcome}) == len(Outcome)


def test_the_declared_facts():
    """What the table says today, as the search's rules state them (``search.edge_search``'s docstring)."""
    assert {o for o in Outcome if o.meaning.memory_verdict} == {Outcome.OUT_OF_MEMORY, Outcome.STILL_RISING}
    assert {o for o in Outcome if o.meaning.stops_search} == {Outcome.ERROR}
    assert {o for o in Outcome if o.meaning.retried} == {Outcome.CRASHED, Outcome.TIMED_OUT}
    assert {o for o in Outcome if o.meaning.must_reproduce} == {Outcome.CRASHED, Outcome.TIMED_OUT}
    assert sorted(
        (o for o in Outcome if o.meaning.precedence is not None), key=lambda o: o.meaning.precedence or 0
    ) == [Outcome.ERROR, Outcome.OUT_OF_MEMORY, Outcome.STILL_RISING]
    assert Outcome.OUT_OF_MEMORY.meaning.stop is StopReason.START_DOES_NOT_FIT


def test_exit_codes_are_unchanged():
    """The exit codes the table leads to, through ``result.exit_code_for``, as the README documents them."""
    assert {reason.value: int(exit_code_for(reason)) for reason in StopReason} == {
        "edge_found": 0,
        "capped": 0,
        "start_does_not_fit": 3,
        "error": 4,
        "crashed": 4,
        "timed_out": 4,
        "still_rising": 4,
        "interrupted": 130,
        "terminated": 143,
        "bad_spec": 2,
        "internal_error": 1,
    }


@pytest.mark.parametrize("outcome", FAILURES)
def test_the_verdicts_read_the_table(outcome):
    """One failure at a batch: a retried class waits for its retry, a decisive one decides at once."""
    judged = verdicts([Observation(4, outcome)], Limits(start=4, retries=1))
    assert judged[4].outcome is (None if outcome.meaning.retried else outcome)


def test_a_decisive_failure_outranks_by_precedence():
    history = [
        Observation(4, Outcome.STILL_RISING),
        Observation(4, Outcome.OUT_OF_MEMORY),
        Observation(4, Outcome.ERROR),
    ]
    assert verdicts(history, Limits(start=4))[4].outcome is Outcome.ERROR
    assert verdicts(history[:2], Limits(start=4))[4].outcome is Outcome.OUT_OF_MEMORY
