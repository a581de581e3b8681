"""A command started ahead of its trial (issue 49, part 3; issue 55): which commands, the plan, and the runner in a
real interpreter (``child/shim/_isoprobe_warm.py``): it runs nothing of the script's before the trial is due, not
even its imports, then runs the script as ``python SCRIPT`` would, at the trial's batch, seeing what a cold start
sees from its first line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from isoprobe.child.command_trial import warm as warm_command
from isoprobe.pipeline.command_ahead import command_plan, starts_ahead
from isoprobe.protocol.messages import TrialRequest
from isoprobe.protocol.warm_command import WarmPlan, go_message, warm_shape
from isoprobe.spec.model import Spec


@pytest.mark.parametrize("argv, interpreter, module, target, arguments", [
    (["python", "train.py", "--bs", "{batch_size}"], ("python",), False, "train.py", ("--bs", "{batch_size}")),
    (["/opt/venv/bin/python3.11", "-u", "-X", "dev", "t.py"], ("/opt/venv/bin/python3.11", "-u", "-X", "dev"), False,
     "t.py", ()),
    (["python3", "-uB", "-Wignore", "t.py", "x"], ("python3", "-uB", "-Wignore"), False, "t.py", ("x",)),
    (["python", "-m", "pkg.train", "--bs={batch_size}"], ("python",), True, "pkg.train", ("--bs={batch_size}",)),
])
def test_a_python_script_or_module_can_be_started_ahead(argv, interpreter, module, target, arguments):
    shape = warm_shape(argv)
    assert (shape.interpreter, shape.module, shape.target, shape.arguments) == (interpreter, module, target, arguments)


@pytest.mark.parametrize("argv", [
    ["torchrun", "--nproc-per-node", "2", "t.py"],  # a launcher: its ranks are started by it, not here
    ["/bin/sh", "-c", "python t.py"],
    ["python", "-c", "import t"],
    ["python", "-E", "t.py"], ["python", "-I", "t.py"], ["python", "-S", "t.py"],  # would not load the shim
    ["python", "--check-hash-based-pycs", "always", "t.py"],
    ["python"], ["python", "-"], ["python", "-m"], ["python", "-u"],
    ["python", "{batch_size}.py"],  # the batch chooses the script
    ["accelerate", "launch", "t.py"],
])
def test_any_other_command_starts_cold(argv):
    assert warm_shape(argv) is None


def test_the_trial_goes_to_the_runner_as_nul_separated_words():
    message = go_message({"ISOPROBE_BATCH_SIZE": "12"}, ["--bs", "12", "a b", "é"])
    assert message.split(b"\0") == [b"1", b"ISOPROBE_BATCH_SIZE=12", b"--bs", b"12", b"a b", "é".encode()]


def _spec(command, **search) -> Spec:
    return Spec.model_validate({"command": command, "command_dir": "/tmp", "search": {"command_ahead": True, **search}})


def test_a_command_starts_ahead_only_when_asked():
    """Off by default (issue 55): on a busy node a probe with it took 1.4 to 1.7 times as long as without."""
    spec = Spec.model_validate({"command": "python train.py --bs {batch_size}"})
    assert not starts_ahead(spec) and command_plan(spec, "cpu", None, None) is None


def test_the_plan_holds_only_what_the_commands_environment_depends_on():
    spec = _spec("python train.py --bs {batch_size}")
    assert starts_ahead(spec)
    cpu = WarmPlan.model_validate_json(command_plan(spec, "cpu", 1 << 30, 5.0))
    assert cpu.argv == ["python", "train.py", "--bs", "{batch_size}"] and cpu.cwd == "/tmp"
    assert cpu.memory_budget_bytes is None and cpu.cuda_outside_bytes is None  # known before the check: the same
    assert command_plan(spec, "cpu", None, None) == command_plan(spec, "cpu", 1 << 30, 5.0)
    cuda = WarmPlan.model_validate_json(command_plan(spec, "cuda:0", 8 << 30, 5.0))
    assert (cuda.memory_budget_bytes, cuda.cuda_outside_bytes) == (8 << 30, 5.0)


@pytest.mark.parametrize("command, search", [
    ("python train.py --bs {batch_size}", {"warm_start": False}),
    ("python train.py --bs {batch_size}", {"fork_server": True}),
    ("torchrun --standalone t.py --bs {batch_size}", {}),
])
def test_no_plan_without_warm_start_with_forks_asked_for_or_for_another_shape(command, search):
    spec = _spec(command, **search)
    assert not starts_ahead(spec) and command_plan(spec, "cpu", None, None) is None


# ----------------------------------------------------------------------------------------------- the runner

SCRIPT = """\
import json
import helper_mod
import os, sys
print(json.dumps({"argv": sys.argv, "batch": os.environ.get("ISOPROBE_BATCH_SIZE"), "file": __file__,
                  "name": __name__, "path0": sys.path[0], "helper_saw_batch": helper_mod.BATCH,
                  "main_is_me": sys.modules["__main__"].__dict__ is globals()}))
if "--fail" in sys.argv:
    raise ValueError("the script's own error")
"""
#: The user's own module: imported only once the trial is due (it sees the batch), never by the preload.
HELPER = "import os\nBATCH = os.environ.get('ISOPROBE_BATCH_SIZE')\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "helper_mod.py").write_text(HELPER)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(HELPER)
    (package / "train.py").write_text(SCRIPT.replace("import helper_mod", "import pkg as helper_mod"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.chdir(scratch)  # the trial's folder is made in the process's working directory, as a trial's is
    return tmp_path


def _request(project: Path, command: list[str], batch: int) -> TrialRequest:
    spec = Spec.model_validate({"command": command, "command_dir": str(project)})
    return TrialRequest(spec=spec, batch_size=batch, device="cpu")


def _plan(project: Path, command: list[str]) -> str:
    return WarmPlan(argv=command, cwd=str(project), device="cpu", memory_budget_bytes=None,
                    cuda_outside_bytes=None).model_dump_json()


def _run(project: Path, command: list[str], batch: int, **ended) -> tuple[dict, Path]:
    ahead = warm_command.start_ahead(_plan(project, command))
    ready = warm_command.wait_ready(ahead, 60)
    assert ready is not None and ready.since > 0
    time.sleep(0.2)  # idle, as a runner waits for its trial
    taken = warm_command.take(_request(project, command, batch))
    assert taken is ahead
    process = warm_command.go(ahead, _request(project, command, batch))
    assert process.wait(timeout=60) == ended.get("status", 0)
    return {"ready": ready, "stdout": (ahead.folder / "stdout").read_text(),
            "stderr": (ahead.folder / "stderr").read_text()}, ahead.folder


def test_the_runner_imports_nothing_ahead_then_runs_the_script_as_python_would(project):
    command = [sys.executable, "train.py", "--bs", "{batch_size}"]
    found, folder = _run(project, command, 12)
    seen = json.loads(found["stdout"])
    assert seen == {"argv": ["train.py", "--bs", "12"], "batch": "12", "file": str(project / "train.py"),
                    "name": "__main__", "path0": str(project), "helper_saw_batch": "12", "main_is_me": True}
    assert folder.name.startswith("command-") and folder.parent == Path.cwd()


def test_the_runner_runs_a_module_as_python_m_would(project):
    command = [sys.executable, "-m", "pkg.train", "{batch_size}"]
    found, _ = _run(project, command, 5)
    seen = json.loads(found["stdout"])
    assert seen["name"] == "__main__" and seen["argv"] == [str(project / "pkg" / "train.py"), "5"]
    assert seen["helper_saw_batch"] == "5"  # the package's __init__ ran at the trial, not before
    assert seen["path0"] == str(project)


def test_the_scripts_error_is_reported_as_the_interpreter_would_without_the_runners_frames(project):
    command = [sys.executable, "train.py", "{batch_size}", "--fail"]
    found, _ = _run(project, command, 3, status=1)
    assert "ValueError: the script's own error" in found["stderr"]
    assert 'File "' + str(project / "train.py") + '", line 8' in found["stderr"]
    assert "_isoprobe_warm" not in found["stderr"] and "sitecustomize" not in found["stderr"]


def test_a_trial_for_another_command_ends_the_runner_and_starts_cold(project):
    command = [sys.executable, "train.py", "{batch_size}"]
    ahead = warm_command.start_ahead(_plan(project, command))
    assert warm_command.wait_ready(ahead, 60) is not None
    other = [sys.executable, "train.py", "--other", "{batch_size}"]
    assert warm_command.take(_request(project, other, 4)) is None
    assert ahead.process.wait(timeout=10) is not None
    assert (ahead.folder / "stdout").read_text() == ""  # the script never ran
    assert warm_command.take(_request(project, command, 4)) is None  # nothing is started ahead any more


def test_a_runner_whose_trial_never_comes_exits_without_running_the_script(project):
    command = [sys.executable, "train.py", "{batch_size}"]
    ahead = warm_command.start_ahead(_plan(project, command))
    assert warm_command.wait_ready(ahead, 60) is not None
    os.close(ahead.channel)  # EOF: as when the process that started it goes away
    assert ahead.process.wait(timeout=10) == 0
    assert (ahead.folder / "stdout").read_text() == ""
    warm_command._ahead = None


def test_a_command_that_cannot_start_ahead_gets_no_runner(project):
    assert warm_command.start_ahead(_plan(project, ["torchrun", "t.py", "{batch_size}"])) is None


#: A script that reports what it finds at its first line: what a start ahead could change (issue 55's held-out
#: shapes: threads set before ``import torch``, a fork first on ``sys.path``, the batch read at import).
FIRST_LINE = """\
import sys, os
first = {"modules": sorted(sys.modules), "path": sys.path, "env": sorted(os.environ),
         "batch": os.environ.get("ISOPROBE_BATCH_SIZE"), "argv": sys.argv}
os.environ["OMP_NUM_THREADS"] = "2"
import json
print(json.dumps(first))
"""


def test_what_the_script_sees_at_its_first_line_is_what_a_cold_start_sees(project):
    (project / "first.py").write_text(FIRST_LINE)
    command = [sys.executable, "first.py", "--bs", "{batch_size}"]
    found, folder = _run(project, command, 7)
    ahead = json.loads(found["stdout"])
    env = warm_command.request_environment(_request(project, command, 7), folder)
    cold_run = subprocess.run([sys.executable, "first.py", "--bs", "7"], cwd=project, env=env, capture_output=True,
                              check=True)
    cold = json.loads(cold_run.stdout)
    assert ahead == cold
    assert "torch" not in ahead["modules"] and not any(m.startswith("_isoprobe") for m in ahead["modules"])


def test_a_runner_not_at_its_wait_when_the_trial_is_due_is_ended_and_the_trial_starts_cold(project):
    command = [sys.executable, "train.py", "{batch_size}"]
    ahead = warm_command.start_ahead(_plan(project, command))
    assert warm_command.wait_ready(ahead, 60) is not None
    (ahead.folder / "warm-ready").unlink()  # as if its start were still under way (a busy node)
    assert warm_command.take(_request(project, command, 4)) is None
    assert ahead.process.wait(timeout=10) is not None
    assert (ahead.folder / "stdout").read_text() == ""
