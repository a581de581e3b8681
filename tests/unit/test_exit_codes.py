"""What a probe's end means to its caller: the exit code of each stop reason, and a label for each purpose."""

from __future__ import annotations

from typing import get_args

import pytest

from isoprobe.report import outcomes, result
from isoprobe.search import edge_search as search
from isoprobe.errors import ExitCode
from isoprobe.report.outcomes import StopReason
from isoprobe.report.result import exit_code_for


@pytest.mark.parametrize(
    "reason,code",
    [
        (StopReason.EDGE_FOUND, 0),
        (StopReason.CAPPED, 0),
        (StopReason.START_DOES_NOT_FIT, 3),
        (StopReason.ERROR, 4),
        (StopReason.CRASHED, 4),
        (StopReason.TIMED_OUT, 4),
        (StopReason.INTERRUPTED, 130),
        (StopReason.TERMINATED, 143),
        (StopReason.BAD_SPEC, 2),         # the command's stops without a probe result (issue 56): report.stop
        (StopReason.INTERNAL_ERROR, 1),
    ],
)
def test_exit_code_for(reason, code):
    assert exit_code_for(reason) == code
    assert isinstance(exit_code_for(reason), ExitCode)


def test_every_stop_reason_has_an_exit_code():
    assert {exit_code_for(reason) for reason in StopReason} <= set(ExitCode)
    assert ExitCode.BAD_SPEC == 2 and ExitCode.INTERNAL == 1


def test_the_search_and_the_result_share_one_stop_reason():
    assert search.StopReason is result.StopReason is outcomes.StopReason


def test_every_trial_purpose_has_a_progress_label():
    from isoprobe.report.output import _PURPOSE_LABELS
    from isoprobe.report.trial import Trial

    assert set(get_args(Trial.model_fields["purpose"].annotation)) == set(_PURPOSE_LABELS)
