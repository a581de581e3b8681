"""Every stop of ``isoprobe run`` prints one document in the format asked (issue 56, item 2).

Before, a bad spec (exit 2), a ``ProbeError`` raised out of the probe (exit 4: Slurm lost a node's step daemon, no
space left for a trial's files, the environment check failed), a signal before the first trial (130/143) and a bug
in isoprobe (exit 1) left a line on stderr and nothing on stdout: a hook or a pipeline that parses stdout had
nothing to parse. Each is now a ``Result`` (``report.stop``): ``answered`` false, the stop reason, the message, the
trials run so far; as JSON valid against the published schema (docs/result.schema.json), and as shell variables
with ``ISOPROBE_ANSWERED=0`` and ``ISOPROBE_STOP_REASON`` (no ``ISOPROBE_BATCH_SIZE`` without a fallback). Here in
this process, the children scripted (``pipeline.local_executor`` is the seam) or the probe replaced where the stop
comes from outside it; the real processes are tests/integration/test_stop_documents.py.
"""

from __future__ import annotations

import json
from functools import lru_cache

import jsonschema
import pytest
import yaml

from conftest import REPO, cli
from isoprobe.errors import ProbeError, Terminated
from isoprobe.executors.scripted import ScriptedExecutor, crashed, linear
from scripted_probe import HOG_FIXED, HOG_PER_SAMPLE, hog_spec


@lru_cache(maxsize=1)
def result_schema() -> dict:
    return json.loads((REPO / "docs" / "result.schema.json").read_text(encoding="utf-8"))


def document(run, code: int, reason: str) -> dict:
    """stdout is one Result, valid against the published schema, with this stop reason and exit code."""
    assert run.returncode == code, run.stderr
    assert "Traceback" not in run.stderr or reason == "internal_error", run.stderr
    result = json.loads(run.stdout)
    jsonschema.validate(result, result_schema())
    assert result["stop_reason"] == reason and result["answered"] is False
    return result


def variables(run, code: int, reason: str) -> dict[str, str]:
    """stdout as ``export NAME=VALUE`` lines: the stop's variables, and no batch size to train with."""
    assert run.returncode == code, run.stderr
    exported = dict(line.removeprefix("export ").split("=", 1) for line in run.stdout.splitlines()
                    if line.startswith("export "))
    assert exported["ISOPROBE_ANSWERED"] == "0" and exported["ISOPROBE_STOP_REASON"] == reason, run.stdout
    assert "ISOPROBE_BATCH_SIZE" not in exported and "ISOPROBE_FALLBACK" not in exported
    return exported


@pytest.fixture
def bad_spec(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**hog_spec(), "bogus": 1}))
    return path


@pytest.fixture
def good_spec(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(hog_spec(start_batch_size=4)))
    return path


def scripted(monkeypatch, script):
    """The command's children answered by ``script`` (the environment check and every trial)."""
    monkeypatch.setattr("isoprobe.pipeline.pipeline.local_executor", lambda spec: ScriptedExecutor(script))


def stopped_outside(monkeypatch, raised: BaseException):
    """The probe raises ``raised`` before any trial (a signal or a bug in the cache, the lock, the ranks)."""
    def answer_for(*args, **kwargs):
        raise raised
    monkeypatch.setattr("isoprobe.api.answer_for", answer_for)


# --------------------------------------------------------------------------- exit 2: a bad spec


def test_a_bad_spec_prints_its_document_with_the_rendered_error(bad_spec):
    run = cli("run", str(bad_spec), "--format", "json")
    result = document(run, 2, "bad_spec")
    assert result["spec"] is None and result["allocator"] is None and result["trials"] == []
    assert result["message"].startswith(f"{bad_spec}: bogus: unknown field 'bogus'")
    assert "\n    fix: " in result["message"]
    assert run.stderr.startswith(f"isoprobe: {bad_spec}: bogus: unknown field")  # said for people, as before


@pytest.mark.parametrize("fmt", ["env", "taskprolog"])
def test_a_bad_spec_as_shell_variables(bad_spec, fmt):
    run = cli("run", str(bad_spec), "--format", fmt)
    variables(run, 2, "bad_spec")


def test_a_bad_spec_in_a_pipe_with_the_default_format_is_json_and_a_table_asked_for_is_left_to_stderr(bad_spec):
    assert json.loads(cli("run", str(bad_spec)).stdout)["stop_reason"] == "bad_spec"  # auto: stdout is no terminal
    table = cli("run", str(bad_spec), "--format", "table")
    assert table.returncode == 2 and table.stdout == "" and "unknown field 'bogus'" in table.stderr


def test_a_usage_error_stays_one_line_on_stderr(good_spec):
    """argparse's usage errors, and a command line isoprobe refuses before it reads the spec, have no document."""
    run = cli("run", str(good_spec), "--format", "json", "--fallback-batch-size", "8")
    assert run.returncode == 2 and run.stdout == "" and "--fallback-batch-size needs --format env" in run.stderr


# --------------------------------------------------------------------------- exit 3 and 4: the probe's own stops


def test_nothing_fits_prints_a_document_valid_against_the_schema(good_spec, monkeypatch):
    scripted(monkeypatch, linear(HOG_FIXED + 2 * 1024**3, HOG_PER_SAMPLE))  # more than the 1.5 GiB at any batch
    document(cli("run", str(good_spec), "--format", "json"), 3, "start_does_not_fit")


def test_a_trial_that_keeps_crashing_prints_its_document(good_spec, monkeypatch):
    scripted(monkeypatch, lambda call: crashed())
    result = document(cli("run", str(good_spec), "--format", "json"), 4, "crashed")
    assert result["trials"] and all(t["outcome"] == "crashed" for t in result["trials"])


# --------------------------------------------------------------------------- exit 4: a ProbeError out of the probe


LOST = ("Slurm lost the step daemon (slurmstepd) of node n2 under the trial's job step 7.3 (batch 16, 2 ranks): "
        "that is the node, not the batch, so the probe stops without an answer")


def lost_at_third_trial(monkeypatch):
    """Two trials fit, then the third is lost to Slurm: ``ProbeError`` out of the executor (``srun_gang``)."""
    device = linear(HOG_FIXED, HOG_PER_SAMPLE)

    def script(call):
        if call.number == 3:
            raise ProbeError(LOST, evidence="rank 1's parent there (pid 4242) ended mid-trial")
        return device(call)

    scripted(monkeypatch, script)


def test_a_probe_error_prints_its_message_and_the_trials_so_far(good_spec, monkeypatch):
    lost_at_third_trial(monkeypatch)
    run = cli("run", str(good_spec), "--format", "json")
    result = document(run, 4, "error")
    assert result["message"] == LOST
    assert [(t["index"], t["outcome"]) for t in result["trials"]] == [(1, "fits"), (2, "fits")]
    assert result["spec"]["search"]["start_batch_size"] == 4  # the spec as validated
    assert f"isoprobe: {LOST}" in run.stderr.splitlines()  # and said on stderr, with the evidence, as before
    assert "rank 1's parent there (pid 4242) ended mid-trial" in run.stderr


@pytest.mark.parametrize("fmt", ["env", "taskprolog"])
def test_a_probe_error_as_shell_variables(good_spec, monkeypatch, fmt):
    lost_at_third_trial(monkeypatch)
    run = cli("run", str(good_spec), "--format", fmt)
    variables(run, 4, "error")
    assert "slurmstepd" in run.stdout  # the warning line a job's stderr gets (echo ... >&2, or print)


def test_a_probe_error_in_hook_mode_is_the_fallback_and_the_log_holds_the_document(good_spec, monkeypatch, tmp_path):
    lost_at_third_trial(monkeypatch)
    log = tmp_path / "isoprobe.log"
    run = cli("run", str(good_spec), "--format", "env", "--fallback-batch-size", "8", "--log", str(log))
    assert run.returncode == 0, run.stderr
    assert "export ISOPROBE_BATCH_SIZE=8" in run.stdout and "export ISOPROBE_STOP_REASON=error" in run.stdout
    logged = log.read_text()
    start = logged.index("{\n")
    stop_document = json.loads(logged[start:logged.index("\n}\n", start) + 2])
    assert stop_document["stop_reason"] == "error" and len(stop_document["trials"]) == 2


# --------------------------------------------------------------------------- 130/143: a signal before the first trial


@pytest.mark.parametrize(("raised", "code", "reason", "name"), [
    (KeyboardInterrupt(), 130, "interrupted", "SIGINT"), (Terminated(), 143, "terminated", "SIGTERM")])
def test_a_signal_before_the_first_trial_prints_its_document(good_spec, monkeypatch, raised, code, reason, name):
    """A signal while the command waits for another isoprobe's answer (the cache's lock), or resolves the ranks."""
    stopped_outside(monkeypatch, raised)
    run = cli("run", str(good_spec), "--format", "json")
    result = document(run, code, reason)
    assert result["message"] == f"stopped by {name} before the first trial" and result["trials"] == []
    assert result["spec"] is not None
    assert f"isoprobe: stopped by {name} before the first trial" in run.stderr
    variables(cli("run", str(good_spec), "--format", "env"), code, reason)


def test_a_signal_before_the_first_trial_in_hook_mode_is_the_stop_not_the_fallback(good_spec, monkeypatch):
    """A signal is no failure the fallback covers (the job is being stopped): its variables, and 143."""
    stopped_outside(monkeypatch, Terminated())
    run = cli("run", str(good_spec), "--format", "taskprolog", "--fallback-batch-size", "8")
    variables(run, 143, "terminated")


# --------------------------------------------------------------------------- exit 1: a bug in isoprobe


def test_a_bug_in_isoprobe_prints_its_document_and_the_traceback(good_spec, monkeypatch):
    stopped_outside(monkeypatch, ZeroDivisionError("division by zero"))
    run = cli("run", str(good_spec), "--format", "json")
    result = document(run, 1, "internal_error")
    assert result["message"] == "internal error: ZeroDivisionError: division by zero"
    assert "Traceback" in run.stderr and "ZeroDivisionError" in run.stderr  # for whoever fixes it
    variables(cli("run", str(good_spec), "--format", "env"), 1, "internal_error")


def test_every_stop_reason_a_document_can_carry_is_in_the_published_schema():
    from isoprobe.report.outcomes import StopReason

    schema = result_schema()
    listed = schema["$defs"]["StopReason"]["enum"]
    assert set(listed) == {reason.value for reason in StopReason}
