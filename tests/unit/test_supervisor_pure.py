"""The supervisor's pure parts: verdicts from literal child runs, events files, child environments,
and the exit code each stop reason maps to. No process is started here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from isoprobe.errors import ExitCode
from isoprobe.outcomes import Outcome
from isoprobe.result import StopReason, exit_code_for
from isoprobe.supervisor import (
    MALLOC_MMAP_THRESHOLD,
    ChildRun,
    Verdict,
    child_environment,
    classify_exit,
    read_events,
)

STARTED = {"event": "started"}
IMPORTED = {"event": "imported", "memory": {"peak_rss": 1}}
BUILT = {"event": "model_built"}


def step(n: int) -> dict:
    return {"event": "step", "step": n, "seconds": 0.1}


def result(outcome: str, **extra) -> dict:
    return {"event": "result", "outcome": outcome, **extra}


def run(returncode: int = 0, events: list[dict] | None = None, timed_out: bool = False) -> ChildRun:
    return ChildRun(returncode=returncode, timed_out=timed_out, seconds=1.0, events=events or [])


# --------------------------------------------------------------------------- classify_exit


def test_result_fits_and_clean_exit_is_fits():
    events = [STARTED, IMPORTED, BUILT, step(1), step(2), result("fits", phase="done", peak_bytes=123)]
    verdict = classify_exit(run(0, events))
    assert verdict.outcome is Outcome.FITS
    assert verdict.result == events[-1]
    assert verdict.phase == "done"
    assert verdict.signal_name is None


def test_result_fits_then_segfault_is_crashed():
    verdict = classify_exit(run(-11, [STARTED, step(1), result("fits", phase="done")]))
    assert verdict.outcome is Outcome.CRASHED
    assert verdict.signal_name == "SIGSEGV"
    assert verdict.result is not None and verdict.result["outcome"] == "fits"


def test_result_fits_then_nonzero_exit_is_crashed():
    verdict = classify_exit(run(1, [result("fits", phase="done")]))
    assert verdict.outcome is Outcome.CRASHED
    assert verdict.signal_name is None


def test_no_result_and_clean_exit_is_crashed():
    verdict = classify_exit(run(0, [STARTED, IMPORTED]))
    assert verdict.outcome is Outcome.CRASHED
    assert verdict.result is None
    assert verdict.signal_name is None
    assert verdict.phase == "imported"


def test_no_result_and_sigkill_is_crashed():
    verdict = classify_exit(run(-9, [STARTED, IMPORTED, BUILT, step(1)]))
    assert verdict == Verdict(Outcome.CRASHED, None, "step 1", "SIGKILL")


def test_no_events_at_all():
    verdict = classify_exit(run(-6, []))
    assert verdict == Verdict(Outcome.CRASHED, None, None, "SIGABRT")


def test_unknown_signal_number_still_named():
    verdict = classify_exit(run(-200, []))
    assert verdict.outcome is Outcome.CRASHED
    assert verdict.signal_name == "signal 200"


def test_timed_out_wins_over_everything():
    verdict = classify_exit(run(-9, [STARTED, step(1), result("fits", phase="done")], timed_out=True))
    assert verdict.outcome is Outcome.TIMED_OUT
    assert verdict.signal_name == "SIGKILL"
    no_result = classify_exit(run(-15, [STARTED, BUILT], timed_out=True))
    assert no_result.outcome is Outcome.TIMED_OUT
    assert no_result.phase == "model_built"


def test_result_out_of_memory_and_clean_exit_is_out_of_memory():
    error = {"type": "torch.OutOfMemoryError", "message": "CUDA out of memory."}
    verdict = classify_exit(run(0, [STARTED, BUILT, result("out_of_memory", phase="model_built", error=error)]))
    assert verdict.outcome is Outcome.OUT_OF_MEMORY
    assert verdict.result["error"] == error
    assert verdict.phase == "model_built"


def test_failure_verdict_stands_despite_unclean_exit():
    verdict = classify_exit(run(-11, [result("out_of_memory", phase="step 1")]))
    assert verdict.outcome is Outcome.OUT_OF_MEMORY
    assert verdict.signal_name == "SIGSEGV"
    assert classify_exit(run(1, [result("error", phase="model_built")])).outcome is Outcome.ERROR


@pytest.mark.parametrize("outcome", ["garbage", "", None, 7, "FITS", ["fits"]])
def test_result_with_garbage_outcome_is_crashed(outcome):
    verdict = classify_exit(run(0, [STARTED, {"event": "result", "outcome": outcome}]))
    assert verdict.outcome is Outcome.CRASHED
    assert verdict.result is not None


def test_result_without_outcome_is_crashed():
    assert classify_exit(run(0, [{"event": "result"}])).outcome is Outcome.CRASHED


def test_the_last_result_counts():
    events = [result("out_of_memory", phase="step 1"), result("fits", phase="done")]
    assert classify_exit(run(0, events)).outcome is Outcome.FITS


def test_phase_is_taken_from_the_last_step_event():
    verdict = classify_exit(run(-9, [STARTED, IMPORTED, BUILT, step(1), step(2), step(3)]))
    assert verdict.phase == "step 3"


def test_phase_ignores_events_that_are_not_phases():
    verdict = classify_exit(run(-9, [STARTED, IMPORTED, BUILT, step(2), {"event": "note", "text": "hi"}]))
    assert verdict.phase == "step 2"


# --------------------------------------------------------------------------- read_events


def test_read_events_keeps_only_complete_json_object_lines(tmp_path):
    path = tmp_path / "trial.events.jsonl"
    good = [{"event": "started", "pid": 1}, {"event": "step", "step": 1}, {"event": "result", "outcome": "fits"}]
    data = b"".join(
        [
            json.dumps(good[0]).encode() + b"\n",
            b"this is not json\n",
            b"\xff\xfe\x00\x81binary junk\x00\n",
            json.dumps(good[1]).encode() + b"\n",
            b"[1, 2, 3]\n",            # JSON, but not an object
            b"42\n",
            b"\n",                     # empty line
            b'{"event": "ste\n',       # cut in the middle, then more was written
            json.dumps(good[2]).encode() + b"\n",
            b'{"event": "result", "outcome": "out_of_',  # the child died mid-write
        ]
    )
    path.write_bytes(data)
    assert read_events(path) == good


def test_read_events_drops_a_complete_looking_last_line_without_newline(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"event": "started"}\n{"event": "result", "outcome": "fits"}')
    assert read_events(path) == [{"event": "started"}]


def test_read_events_missing_file_is_empty(tmp_path):
    assert read_events(tmp_path / "never-written.jsonl") == []


def test_read_events_empty_file(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b"")
    assert read_events(path) == []


def test_truncated_result_reads_as_crashed(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"event": "started"}\n{"event": "step", "step": 1}\n{"event": "result", "outc')
    verdict = classify_exit(ChildRun(returncode=-9, timed_out=False, seconds=2.0, events=read_events(path)))
    assert verdict.outcome is Outcome.CRASHED
    assert verdict.phase == "step 1"
    assert verdict.signal_name == "SIGKILL"


# --------------------------------------------------------------------------- child_environment


def test_child_environment_cpu_with_allocator(tmp_path):
    events = tmp_path / "t.events.jsonl"
    base = {"PATH": "/usr/bin", "HOME": "/home/u", "CUDA_VISIBLE_DEVICES": "0,1"}
    env = child_environment(base, backend="cpu", allocator="expandable_segments:True", events_path=events)
    assert env["ISOPROBE_EVENTS"] == str(events)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(MALLOC_MMAP_THRESHOLD)
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/home/u"
    # The base mapping is not modified.
    assert base == {"PATH": "/usr/bin", "HOME": "/home/u", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_child_environment_allocator_overrides_an_inherited_one(tmp_path):
    base = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}
    env = child_environment(base, backend="cuda", allocator="expandable_segments:True", events_path=tmp_path / "e")
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"


def test_child_environment_without_allocator_leaves_the_inherited_one(tmp_path):
    base = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    env = child_environment(base, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_ALLOC_CONF" not in env


def test_child_environment_without_allocator_sets_none(tmp_path):
    env = child_environment({}, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert "PYTORCH_ALLOC_CONF" not in env


def test_child_environment_cuda_keeps_the_gpus_and_malloc(tmp_path):
    base = {"CUDA_VISIBLE_DEVICES": "1"}
    env = child_environment(base, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "MALLOC_MMAP_THRESHOLD_" not in env
    no_gpu_var = child_environment({}, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert "CUDA_VISIBLE_DEVICES" not in no_gpu_var


def test_child_environment_makes_the_package_importable_and_keeps_pythonpath(tmp_path):
    import isoprobe

    package_root = str(Path(isoprobe.__file__).resolve().parent.parent)
    env = child_environment({"PYTHONPATH": "/user/lib"}, backend="cpu", allocator=None, events_path=tmp_path / "e")
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == package_root
    assert "/user/lib" in parts
    bare = child_environment({}, backend="cpu", allocator=None, events_path=tmp_path / "e")
    assert bare["PYTHONPATH"] == package_root  # no empty entry (which would mean the working directory)
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONFAULTHANDLER"] == "1"


def test_child_environment_accepts_os_environ(tmp_path):
    env = child_environment(os.environ, backend="cpu", allocator=None, events_path=tmp_path / "e")
    assert isinstance(env, dict)
    assert env["ISOPROBE_EVENTS"] == str(tmp_path / "e")
    assert "ISOPROBE_EVENTS" not in os.environ or os.environ["ISOPROBE_EVENTS"] != env["ISOPROBE_EVENTS"]


# --------------------------------------------------------------------------- exit codes


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
    ],
)
def test_exit_code_for(reason, code):
    assert exit_code_for(reason) == code
    assert isinstance(exit_code_for(reason), ExitCode)


def test_every_stop_reason_has_an_exit_code():
    assert {exit_code_for(reason) for reason in StopReason} <= set(ExitCode)
    assert ExitCode.BAD_SPEC == 2 and ExitCode.INTERNAL == 1


def test_read_events_survives_absurdly_nested_json(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"[" * 100000 + b"\n" + json.dumps({"event": "started"}).encode() + b"\n")
    assert read_events(path) == [{"event": "started"}]


def test_every_trial_purpose_has_a_progress_label():
    from typing import get_args

    from isoprobe.output import _PURPOSE_LABELS
    from isoprobe.result import Trial

    assert set(get_args(Trial.model_fields["purpose"].annotation)) == set(_PURPOSE_LABELS)


def test_sigkill_while_the_cgroup_counted_an_oom_kill_is_out_of_memory():
    verdict = classify_exit(ChildRun(returncode=-9, timed_out=False, seconds=1.0, events=[], oom_kills=1))
    assert verdict.outcome is Outcome.OUT_OF_MEMORY
    assert "oom_kill" in verdict.evidence


@pytest.mark.parametrize("oom_kills", [0, None])
def test_sigkill_without_kernel_evidence_stays_crashed(oom_kills):
    verdict = classify_exit(ChildRun(returncode=-9, timed_out=False, seconds=1.0, events=[], oom_kills=oom_kills))
    assert verdict.outcome is Outcome.CRASHED and verdict.evidence is None


def test_oom_kill_counter_parsing_v1_and_v2(tmp_path):
    from isoprobe.oomkill import oom_kill_count

    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 5\noom_group_kill 0\n")
    assert oom_kill_count(v1) == 3
    assert oom_kill_count(v2) == 5
    assert oom_kill_count(tmp_path / "missing") is None
    assert oom_kill_count(None) is None


def test_write_atomically_replaces_whole_and_leaves_no_temporary(tmp_path):
    from isoprobe.supervisor import write_atomically

    target = tmp_path / "request.json"
    target.write_text("old")
    write_atomically(target, '{"new": true}')
    assert target.read_text() == '{"new": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["request.json"]


def test_stderr_tail_keeps_faulthandlers_headline_behind_a_long_dump(tmp_path):
    from isoprobe.supervisor import _tail

    stderr = tmp_path / "stderr"
    dump = "Fatal Python error: Segmentation fault\n\n" + "".join(
        f'  File "/some/long/path/module{i}.py", line {i} in function_{i}\n' for i in range(400)
    )
    stderr.write_text("model output\n" * 50 + dump)
    tail = _tail(stderr)
    assert tail.startswith("Fatal Python error: Segmentation fault\n[...]\n")
    assert tail.endswith("line 399 in function_399\n")
    short = tmp_path / "short"
    short.write_text("Fatal Python error: Aborted\n\nCurrent thread 0x1\n")
    assert _tail(short) == "Fatal Python error: Aborted\n\nCurrent thread 0x1\n"
