"""issue 47, 'misleading': what a command probe that timed out says. 'no optimizer step seen' only where no step
was seen; the stderr tail suggested only where something was printed."""

from __future__ import annotations

from isoprobe.pipeline.explain import Found, explain
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report.device import DeviceInfo
from isoprobe.report.trial import Trial
from isoprobe.spec.model import Spec

SPEC = Spec.model_validate({"command": "torchrun --nproc-per-node 2 train.py {batch_size}", "command_dir": "/tmp",
                            "search": {"trial_timeout": 120}})
INFO = DeviceInfo(backend="cpu", requested="cpu", name="cpu", total_memory_bytes=8 << 30, memory_budget_bytes=1 << 30,
                  budget_source="spec", capacity_bytes=1 << 30)


def _timed_out(steps: int, stderr: str | None) -> Trial:
    return Trial(index=1, batch_size=16, purpose="search", outcome=Outcome.TIMED_OUT, seconds=120.0,
                 step_budget_peak_bytes=[700 << 20] * steps, stderr_tail=stderr)


def _said(trial: Trial) -> tuple[str, list[str]]:
    return explain(Found(StopReason.TIMED_OUT, None, None), SPEC, INFO, [trial], None)


def test_a_trial_whose_steps_were_seen_is_not_one_where_no_step_was_seen():
    message, suggestions = _said(_timed_out(2, "rank 1 waiting\n"))
    assert "after 2 optimizer step(s) were seen" in message and "no optimizer step seen" not in message
    assert any("stderr_tail" in s for s in suggestions)


def test_the_stderr_tail_is_pointed_at_only_where_the_command_printed_something():
    """Without the supervisor's record of the command (``CommandSeen``), the child's own stderr is all there is, and
    it is not the command's: an empty one says nothing of what the command printed (issue 56 found "printed nothing"
    said of a command that printed its steps). tests/unit/test_command_endings_said.py has the record's cases."""
    message, suggestions = _said(_timed_out(0, ""))
    assert "no optimizer step seen" in message
    assert not any("stderr_tail" in s for s in suggestions) and not any("printed nothing" in s for s in suggestions)
