"""When a command trial has stepped enough: every rank steady, and the readings the parent judges steady too."""

from __future__ import annotations

from isoprobe.child.command_trial.supervisor import _enough
from isoprobe.protocol.messages import TrialRequest
from isoprobe.report import steady
from isoprobe.spec.model import Spec

MiB = 1 << 20


def _request() -> TrialRequest:
    spec = Spec.model_validate({"command": "python train.py {batch_size}", "command_dir": "/tmp"})
    return TrialRequest(spec=spec, batch_size=16, device="cpu", steady=steady.rule_for(3, 30, quiet=False))


def test_a_helpers_lower_steps_before_the_scripts_keep_the_trial_stepping_until_the_parents_window_holds_still():
    """A sanity check's two steps at batch 2 (a helper that ended) were the trial's steps 1 and 2; the script's own
    steps, 0.7 MiB higher, are steady from its first. Stopping when the script's steps were steady handed the parent
    a rise of 0.7 MiB in its window: still rising. The trial steps on until the parent's window is the script's."""
    request = _request()
    helper, script = 811 * MiB, 811 * MiB + 700 * 1024
    for judged in range(3, 31):
        judged_peaks = [helper, helper] + [script] * (judged - 2)
        script_alone = [script] * (judged - 2)
        enough = _enough(request, judged, [script_alone], judged_peaks)
        parent_sees_steady = steady.is_steady(judged_peaks, request.steady)
        assert enough == (steady.should_stop(script_alone, request.steady) and parent_sees_steady), judged
        if enough:
            assert parent_sees_steady  # never stopped where the parent would call it still rising
            break
    else:
        raise AssertionError("the trial never had enough")
    assert judged > 2 + steady.window_for([], request.steady)  # the helper's steps left the window first


def test_a_rank_still_rising_keeps_the_trial_stepping_whatever_the_worst_readings_show():
    request = _request()
    rising = [800 * MiB + step * MiB for step in range(8)]
    flat = [900 * MiB] * 8
    assert not _enough(request, 8, [rising, flat], flat)


def test_without_a_steady_rule_the_requests_steps_are_enough():
    request = _request().model_copy(update={"steady": None, "steps": 3})
    assert not _enough(request, 2, [[1, 2]], [1, 2]) and _enough(request, 3, [[1, 2, 3]], [1, 2, 3])
