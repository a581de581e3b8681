"""A frontier keeps every point it answered: a point without a cache entry, a point whose probe raised, a signal.

Issue 34: ``isoprobe frontier --no-cache`` answered every point and then died in
the table (``point.result.cache`` is None without a cache): exit 1, nothing on
stdout; one point whose probe raised (a factory that raises for one value) ended
the whole frontier; a signal outside a point's probe lost every point. Each is
checked here on scripted points (no processes); the real command is
``tests/integration/test_frontier_faults.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from isoprobe.cli.frontier import frontier_exit_code
from isoprobe.errors import Problem, ProbeError, SpecError, Terminated
from isoprobe.pipeline.frontier import FrontierPlan, run_frontier
from isoprobe.report.frontier import FrontierResult, frontier_table
from isoprobe.report.output import Reporter
from isoprobe.report.outcomes import StopReason
from isoprobe.report.result import CacheInfo, Result

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "result-small-cnn.json"
VALUES = [16, 32, 64]


def probed(maximum: int, *, cache: CacheInfo | None = None, stop: StopReason = StopReason.EDGE_FOUND) -> Result:
    """A real ``Result`` (the fixture's) with this maximum; ``cache`` None is what ``--no-cache`` gives."""
    result = Result.model_validate_json(FIXTURE.read_text())
    answered = stop in (StopReason.EDGE_FOUND, StopReason.CAPPED)
    return result.model_copy(update={"max_batch_size": maximum if answered else None,
                                     "recommended_batch_size": maximum if answered else None,
                                     "first_failing_batch_size": maximum + 1, "answered": answered,
                                     "stop_reason": stop, "cache": cache})


def frontier(answers: dict, stopped=None) -> FrontierResult:
    """``run_frontier`` over VALUES; ``answers[value]`` is the point's Result, or an exception its probe raises."""
    asked = []

    def answer_point(spec, borrowed):
        asked.append(spec)
        answer = answers[spec]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    plan = FrontierPlan("lm.yaml", "input.shape.0", VALUES, VALUES, "increasing")
    noted = {} if stopped is None else {"stopped": stopped}
    result = run_frontier(plan, Reporter(lambda line: None), answer_point, **noted)
    FrontierResult.model_validate_json(result.model_dump_json())  # every outcome is a valid document
    return result


def test_a_frontier_without_the_cache_is_printed_as_a_table():
    """The issue's example: points probed with --no-cache have no cache entry; the table crashed on it."""
    result = frontier({64: probed(3), 32: probed(7), 16: probed(15)})
    table = frontier_table(result)
    assert table.splitlines()[1].split()[:2] == ["16", "15"]
    assert "cache" not in table.splitlines()[1]
    assert frontier_exit_code(result) == 0


def test_an_unanswered_point_under_the_cache_is_printed_as_a_table():
    """Another of the class: with the cache on, a point without an answer is never stored, so it has no entry
    either (here the longest length, where not even the start batch fits): exit 3, as 'isoprobe run' there."""
    hit = CacheInfo(hit=True, key="k" * 64, path="/cache/k.json", stored_at="2026-01-01T00:00:00Z")
    result = frontier({64: probed(1, stop=StopReason.START_DOES_NOT_FIT), 32: probed(7, cache=hit), 16: probed(15)})
    table = frontier_table(result)
    assert "input.shape.0=64: no answer:" in table
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:4]}
    assert rows["32"][4] == "cache" and rows["64"][1] == "-"
    assert frontier_exit_code(result) == 3 and not result.answered


def test_a_point_whose_probe_raises_is_that_points_error_and_the_others_are_answered():
    """A factory that raises for one value is a SpecError from that point's probe (its environment check); it
    ended the whole frontier. Now it is the point's error, the next points are answered, and the exit code is 4."""
    broken = SpecError("lm.yaml", [Problem("model", "cannot be built: RuntimeError: no 64 here", "check the factory")])
    result = frontier({64: broken, 32: probed(7), 16: probed(15)})
    by_value = {p.value: p for p in result.points}
    assert by_value[64].result is None and "no 64 here" in by_value[64].error
    assert by_value[64].error.startswith("bad spec at this value")
    assert [by_value[v].max_batch_size for v in (16, 32)] == [15, 7]
    assert result.interrupted is None and not result.answered
    assert frontier_exit_code(result) == 4
    assert "input.shape.0=64: no answer: bad spec at this value" in frontier_table(result)


@pytest.mark.parametrize("raised, said", [
    (ProbeError("the probe stopped: No space left on device (/tmp)"), "No space left on device"),
    (ValueError("a bug"), "internal error: ValueError: a bug"),
])
def test_any_failure_of_one_points_probe_is_that_points_error(raised, said):
    """More of the class: the environment check failing, a full TMPDIR, a bug in isoprobe at one value."""
    result = frontier({64: probed(3), 32: raised, 16: probed(15)})
    middle = result.points[1]
    assert middle.value == 32 and middle.result is None and said in middle.error
    assert result.points[0].max_batch_size == 15 and result.points[2].max_batch_size == 3
    assert frontier_exit_code(result) == 4


def test_a_signal_outside_a_points_probe_keeps_the_points_answered():
    """Ctrl-C before the second point's probe could hold it (reading the cache, waiting on its lock) escaped
    the frontier: no point printed. Now: the first point whole, the second 'interrupted before its first trial',
    the third not probed, and exit 130."""
    result = frontier({64: probed(3), 32: KeyboardInterrupt(), 16: probed(15)})
    assert result.interrupted == "interrupted"
    assert [p.probed for p in result.points] == [None, 2, 1]
    assert result.points[2].max_batch_size == 3
    assert result.points[1].error == "interrupted before its first trial"
    assert result.points[0].error == "not probed: the frontier was interrupted"
    assert frontier_exit_code(result) == 130
    assert "interrupted: 2 of 3 points probed" in frontier_table(result)


def test_a_point_its_signal_stopped_keeps_its_trials_and_ends_the_frontier():
    """SIGTERM inside a point's probe: the probe returns the trials it had run (stop_reason terminated); the
    frontier stops there, marked terminated, exit 143 (it was 1: the table crashed on the missing cache)."""
    result = frontier({64: probed(3), 32: probed(5, stop=StopReason.TERMINATED), 16: probed(15)})
    assert result.interrupted == "terminated"
    assert result.points[1].result.stop_reason is StopReason.TERMINATED and result.points[1].trials > 0
    assert result.points[0].result is None and result.points[0].probed is None
    assert frontier_exit_code(result) == 143
    frontier_table(result)


def test_a_signal_noted_between_points_stops_the_frontier_before_the_next():
    """A signal that came while no probe ran (the command noted it: system.stops) ends the frontier before the
    next point starts: the points answered are kept."""
    seen = []

    def stopped():
        seen.append(1)
        return "terminated" if len(seen) > 1 else None

    result = frontier({64: probed(3), 32: probed(7), 16: Terminated()}, stopped)
    assert result.interrupted == "terminated"
    assert [p.probed for p in result.points] == [None, None, 1]
    assert frontier_exit_code(result) == 143


def test_a_document_of_version_1_is_still_read():
    """Saved frontiers from before points could fail (schema_version 1) still plot and validate."""
    point = json.loads(probed(3).model_dump_json())
    old = {"schema_version": 1, "spec_path": "lm.yaml", "field": "input.shape.0", "direction": "increasing",
           "answered": True, "points": [{"value": 64, "probed": 1, "max_batch_size": 3, "recommended_batch_size": 3,
                                          "tokens_per_batch": 192, "trials": 4, "seconds": 1.0, "result": point}],
           "total_trials": 4, "total_seconds": 1.0}
    assert FrontierResult.model_validate(old).points[0].answered
