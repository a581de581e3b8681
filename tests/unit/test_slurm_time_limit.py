"""A SIGTERM from the Slurm job's time limit is named in the stop's message (issue 56, item 2).

A job whose time limit fell mid-probe left only Slurm's "CANCELLED ... DUE TO TIME LIMIT" in its log. isoprobe now
asks Slurm once, at the stop, inside a job only (``system.slurm_job``): a fake ``scontrol`` on PATH here prints
what Slurm 22.05's printed at a time limit's SIGTERM (measured on the test cluster: ``JobState=COMPLETING
Reason=TimeLimit ... TimeLimit=00:01:00``), or another reason, or hangs, or fails. The real cluster's side is
tests/slurm/test_stop_document.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from conftest import cli
from isoprobe.errors import Terminated
from isoprobe.report.outcomes import StopReason
from isoprobe.system import slurm_job
from isoprobe.system.slurm_job import TIME_LIMIT_FIX, limit_if_reached, signal_stop, time_limit_reached
from isoprobe.executors.scripted import ScriptedExecutor, linear
from scripted_probe import HOG_FIXED, HOG_PER_SAMPLE, hog_spec, probe

#: ``scontrol show job -o 1`` at the SIGTERM of a job whose --time=1 was reached (Slurm 22.05, trimmed).
AT_TIME_LIMIT = ("JobId=1 JobName=script-1.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
                 "Nice=0 Account=(null) QOS=(null) JobState=COMPLETING Reason=TimeLimit Dependency=(null) Requeue=1 "
                 "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:01:27 TimeLimit=00:01:00 TimeMin=N/A "
                 "SubmitTime=2026-11-29T12:02:11 StartTime=2026-11-29T12:02:12 EndTime=2026-11-29T12:03:39 "
                 "Partition=debug NodeList=isonode BatchHost=isonode NumNodes=1 NumCPUs=1\n")
RUNNING = AT_TIME_LIMIT.replace("JobState=COMPLETING Reason=TimeLimit", "JobState=RUNNING Reason=None")
CANCELLED = AT_TIME_LIMIT.replace("JobState=COMPLETING Reason=TimeLimit", "JobState=CANCELLED Reason=None")


def fake_scontrol(folder: Path, body: str) -> dict[str, str]:
    """An environment inside Slurm job 1 whose PATH finds ``scontrol`` running ``body`` (sh) first; it records its
    arguments in folder/asked."""
    folder.mkdir(exist_ok=True)
    script = folder / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {folder}/asked\n{body}\n')
    script.chmod(0o755)
    return {"SLURM_JOB_ID": "1", "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def printing(folder: Path, record: str) -> dict[str, str]:
    folder.mkdir(exist_ok=True)
    (folder / "record").write_text(record)
    return fake_scontrol(folder, f"cat {folder}/record")


def test_the_record_at_a_time_limit_gives_the_limit_and_any_other_gives_none():
    assert limit_if_reached(AT_TIME_LIMIT) == "00:01:00"
    assert limit_if_reached(AT_TIME_LIMIT.replace("TimeLimit=00:01:00", "TimeLimit=1-00:00:00")) == "1-00:00:00"
    assert limit_if_reached("JobId=1 JobState=TIMEOUT Reason=None TimeLimit=02:00:00") == "02:00:00"
    assert limit_if_reached("JobId=1 JobState=COMPLETING Reason=TimeLimit") == ""  # reached, the limit not shown
    for record in (RUNNING, CANCELLED, "", "slurm_load_jobs error: Invalid job id specified\n"):
        assert limit_if_reached(record) is None


def test_scontrol_is_asked_once_for_the_jobs_record(tmp_path):
    environ = printing(tmp_path, AT_TIME_LIMIT)
    assert time_limit_reached(environ) == "00:01:00"
    assert (tmp_path / "asked").read_text() == "show job -o 1\n"


def test_outside_a_job_nothing_is_asked(tmp_path):
    environ = printing(tmp_path, AT_TIME_LIMIT)
    del environ["SLURM_JOB_ID"]
    assert time_limit_reached(environ) is None and not (tmp_path / "asked").exists()
    assert time_limit_reached({**environ, "SLURM_JOB_ID": "1; rm -rf /"}) is None  # not a job id: not asked either
    assert not (tmp_path / "asked").exists()


@pytest.mark.parametrize("body", ["exit 1", "echo 'scontrol: error: slurm_load_jobs error' >&2; exit 1"])
def test_scontrol_that_fails_says_nothing(tmp_path, body):
    assert time_limit_reached(fake_scontrol(tmp_path, body)) is None


def test_scontrol_that_hangs_costs_at_most_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm_job, "SCONTROL_SECONDS", 0.5)
    started = time.monotonic()
    assert time_limit_reached(fake_scontrol(tmp_path, "exec sleep 30")) is None
    assert time.monotonic() - started < 5


def test_without_scontrol_nothing_is_said():
    assert time_limit_reached({"SLURM_JOB_ID": "1", "PATH": "/nonexistent"}) is None


def test_the_message_names_the_time_limit_and_what_to_do(tmp_path, monkeypatch):
    for name, value in printing(tmp_path, AT_TIME_LIMIT).items():
        monkeypatch.setenv(name, value)
    start, end = signal_stop("SIGTERM", "before an answer")
    assert start == "stopped by SIGTERM: the Slurm job's time limit (00:01:00) was reached before an answer"
    assert end == f"; {TIME_LIMIT_FIX}" and "--time" in end
    assert signal_stop("SIGINT", "before an answer") == ("stopped by SIGINT before an answer", "")  # not Slurm's
    (tmp_path / "record").write_text(CANCELLED)  # scancel: the words stay as they were
    assert signal_stop("SIGTERM", "before an answer") == ("stopped by SIGTERM before an answer", "")


def test_the_probes_message_puts_what_it_found_between_the_two(tmp_path, monkeypatch):
    """``pipeline.explain`` for a probe stopped mid-trial: the largest batch that fit so far, then the fix."""
    from isoprobe.pipeline.kinds import stopped_by as _stopped_by

    for name, value in printing(tmp_path, AT_TIME_LIMIT).items():
        monkeypatch.setenv(name, value)
    device = linear(HOG_FIXED, HOG_PER_SAMPLE)

    def script(call):
        if call.number == 3:
            raise Terminated()
        return device(call)

    result = probe(hog_spec(start_batch_size=4), ScriptedExecutor(script)).result
    assert result.stop_reason is StopReason.TERMINATED
    assert result.message.startswith("stopped by SIGTERM: the Slurm job's time limit (00:01:00) was reached before "
                                     "an answer; largest batch that fit so far: ")
    assert result.message.endswith(TIME_LIMIT_FIX)
    assert _stopped_by(StopReason.EDGE_FOUND) is None  # an answer asks nothing


def test_the_command_says_it_for_a_sigterm_before_the_first_trial(tmp_path, monkeypatch):
    """The cache's lock, waited on while another job probes the same setup, is where a time limit often falls."""
    def answer_for(*args, **kwargs):
        raise Terminated()

    monkeypatch.setattr("isoprobe.api.answer_for", answer_for)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(hog_spec()))
    run = cli("run", str(spec), "--format", "json", env=printing(tmp_path / "bin", AT_TIME_LIMIT))
    assert run.returncode == 143, run.stderr
    message = json.loads(run.stdout)["message"]
    assert message == ("stopped by SIGTERM: the Slurm job's time limit (00:01:00) was reached before the first "
                       f"trial; {TIME_LIMIT_FIX}")
    assert f"isoprobe: {message}" in run.stderr
