"""``Meaning.allocation_failed``: the token search's only bound, read from the outcome table (issue 58)."""

from __future__ import annotations

import pytest

from isoprobe.report.outcomes import Outcome
from isoprobe.search.token_budget import search_budget


def test_only_out_of_memory_is_a_failed_allocation():
    assert {o for o in Outcome if o.meaning.allocation_failed} == {Outcome.OUT_OF_MEMORY}


@pytest.mark.parametrize("outcome", list(Outcome))
def test_a_failed_allocation_is_a_memory_verdict_and_never_retried(outcome):
    meaning = outcome.meaning
    if meaning.allocation_failed:
        assert meaning.memory_verdict and not meaning.retried and not meaning.fits


@pytest.mark.parametrize("outcome", [o for o in Outcome if not o.meaning.fits])
def test_the_token_search_bounds_on_a_failed_allocation_and_stops_on_anything_else(outcome):
    """Every sample count above 4 ends so at length 10: a bound (a budget of 10 * 5 - 1) where the table says an
    allocation failed, else the search stops there without a budget, whatever the retries."""

    def oracle(samples: int, length: int) -> Outcome:
        return Outcome.FITS if samples <= 4 else outcome

    found = search_budget(oracle, [10], start=4, retries=2, confirmations=0)
    if outcome.meaning.allocation_failed:
        assert (found.budget, found.binding_length, found.stop) == (49, 10, None)
    else:
        assert found.budget is None and found.stop is outcome
        retried = [o for n, _, o in found.trials if n > 4]
        assert len(retried) == (3 if outcome.meaning.retried else 1)
