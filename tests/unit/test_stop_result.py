"""The parts behind "every stop prints its document" (issue 56, item 2), each on its own.

``report.stop.stop_result`` makes a stop the probe gave no result for a ``Result`` of the one model; a
``ProbeError`` carries the trials run before it (``api.answer_for``, from the ``Reporter`` that printed them); a
stop's document is never an answer the cache could give back (an entry without a spec is refused). The command's
side is tests/cli/test_every_stop_prints.py.
"""

from __future__ import annotations

import errno
import json

import pytest

from isoprobe.errors import ProbeError
from isoprobe.executors.scripted import ScriptedExecutor, linear
from isoprobe.report.outcomes import StopReason
from isoprobe.report.output import Reporter, render_table
from isoprobe.report.result import Result, exit_code_for
from isoprobe.report.stop import stop_result
from isoprobe.spec.model import Spec
from scripted_probe import HOG_FIXED, HOG_PER_SAMPLE, SPEC_PATH, hog_spec, probe
from test_orchestration_cache import Recording, ask


def test_a_bad_spec_stop_is_a_valid_result_without_a_spec():
    stopped = stop_result(StopReason.BAD_SPEC, "spec.yaml: bogus: unknown field 'bogus'", spec_path="spec.yaml")
    again = Result.model_validate_json(stopped.model_dump_json())  # what show, plot and a reader take back
    assert again == stopped and again.spec is None and again.allocator is None and again.trials == []
    assert not again.answered and exit_code_for(again.stop_reason) == 2
    assert "spec.yaml (not a valid spec)" in render_table(again) and "unknown field 'bogus'" in render_table(again)


def test_a_probe_error_stop_keeps_the_spec_and_the_trials_so_far():
    trials = probe(hog_spec(start_batch_size=4), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE))).trials[:2]
    spec = Spec.model_validate(hog_spec(start_batch_size=4))
    stopped = stop_result(StopReason.ERROR, "Slurm lost the step daemon", spec_path=SPEC_PATH, spec=spec,
                          trials=trials, seconds=12.3456)
    assert stopped.trials == trials and stopped.spec == spec and stopped.total_seconds == 12.346
    assert exit_code_for(stopped.stop_reason) == 4


def test_the_reporter_keeps_the_trials_it_printed_and_starts_again_with_a_probe_that_does():
    trials = probe(hog_spec(start_batch_size=4), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE))).trials
    lines: list[str] = []
    reporter = Reporter(lines.append)
    for trial in trials[:3]:
        reporter.trial(trial)
    assert reporter.trials == trials[:3] and len(lines) == 3
    reporter.trial(trials[0])  # trial 1 again: the probe started over (its sources changed)
    assert reporter.trials == trials[:1]


class _LostAt:
    """Trials fit until the ``at``-th, which raises ``raised`` (a ProbeError or an OSError out of the executor)."""

    def __init__(self, at: int, raised: BaseException):
        self.at, self.raised, self.device = at, raised, linear(HOG_FIXED, HOG_PER_SAMPLE)

    def __call__(self, call):
        if call.number == self.at:
            raise self.raised
        return self.device(call)


@pytest.mark.parametrize("raised", [
    ProbeError("Slurm lost the step daemon (slurmstepd) of node n2"),
    OSError(errno.ENOSPC, "No space left on device", "/tmp/isoprobe-x/trial-3.request.json"),
])
def test_a_probe_error_out_of_the_probe_carries_the_trials_run_before_it(monkeypatch, raised):
    from isoprobe.api import answer_for

    monkeypatch.setattr("isoprobe.pipeline.pipeline.local_executor", lambda spec: ScriptedExecutor(_LostAt(3, raised)))
    lines: list[str] = []
    with pytest.raises(ProbeError) as caught:
        answer_for(Spec.model_validate(hog_spec(start_batch_size=4)), SPEC_PATH, lines.append, use_cache=False,
                   refresh=False, budget_source="spec")
    assert [(t.index, t.outcome.value) for t in caught.value.trials] == [(1, "fits"), (2, "fits")]
    assert "slurmstepd" in caught.value.message or "No space left on device" in caught.value.message


def test_an_entry_without_a_spec_is_never_a_cached_answer(tmp_path):
    """A stop's document (bad_spec) has no spec; planted in the cache, it is refused, not read as an answer."""
    cache = tmp_path / "cache"
    first, _ = ask(hog_spec(), cache, Recording())
    entry = cache / f"{first.cache.key}.json"
    document = json.loads(entry.read_text())
    document["spec"] = None
    entry.write_text(json.dumps(document))
    again, lines = ask(hog_spec(), cache, (executor := Recording()))
    assert executor.calls and f"cache entry {entry} is not trusted: it holds no spec; probing again" in lines
    assert again.cache.hit is False and again.spec is not None
