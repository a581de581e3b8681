"""Shared helpers: writing specs to a temporary folder and running the real CLI."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
#: The modules the tests import and the trials load (models, faults, hostile code, helpers): not tests themselves.
#: On sys.path here, so that a test imports them by their plain names (``from scripted_probe import probe``), as a
#: trial does through its python_path (``python_path=[str(SUPPORT)]``, a factory ``models:deep_mlp``).
SUPPORT = TESTS / "support"
sys.path.insert(0, str(SUPPORT))
MODELS = SUPPORT / "models.py"
FAULTS = SUPPORT / "faults.py"

# The suite sends SIGINT to isoprobe processes and expects Ctrl-C's behaviour (exit 130 with the
# trials so far). A non-interactive shell starts background commands (`nohup bash .ci/run &`) with
# SIGINT ignored, every child inherits that, and Python then installs no KeyboardInterrupt handler:
# isoprobe rightly keeps ignoring it, and the SIGINT tests hung (measured: SigIgn of the stuck
# isoprobe had SIGINT set, 2026-11-23). A handler, unlike SIG_IGN, is reset to the default at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Make this pytest process a child subreaper: a process that isoprobe orphans is
# re-parented here instead of to init, so it stays a descendant and the
# leftover check below sees it.
_PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


#: Tests that run in one pytest-xdist worker, one after another: those sharing one thing of the machine (the
#: Slurm tier's cluster, its daemons and ports; the one GPU), and modules whose module-scoped fixture is a whole
#: probe measured once for their tests (set up once per worker that runs one of them: measured, the probes of
#: test_probe_cpu, test_real_loop and test_fast_answers each ran twice when their tests were spread;
#: test_fast_answers has no such probe since test_probe_cpu's serves both).
ONE_WORKER = (
    "tests/slurm/",
    "tests/container/",
    "tests/gpu/",
    "tests/integration/test_probe_cpu.py",
    "tests/integration/test_real_loop.py",
    "tests/integration/test_answers.py",
    "tests/integration/test_fidelity.py",
    "tests/integration/test_pid1.py",
    "tests/integration/test_distributed.py",
    "tests/integration/test_distributed_sharded.py",
)


#: The tier of a test follows from its folder under tests/: the marks its tests get, which ``-m integration``, ``-m
#: slurm``, ``-m container`` and ``-m gpu`` select by (no test sets them by hand). A Slurm test is an integration test
#: too: real processes, on a real cluster. The fast tier is the folders without a mark (FAST_FOLDERS); a test in any
#: other place fails the collection, so that no test runs in a tier it was not put in.
FOLDER_MARKS = {
    "integration": ("integration",),
    "slurm": ("slurm", "integration"),
    "container": ("container",),
    "gpu": ("gpu",),
}
FAST_FOLDERS = ("unit", "cli", "docs")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook, which deselects by those marks (-m)
def pytest_collection_modifyitems(config, items):
    """Mark each test with its folder's tier (``FOLDER_MARKS``)."""
    for item in items:
        try:
            folder = item.path.relative_to(TESTS).parts[0]
        except ValueError:  # a test file outside tests/ (given on the command line): no tier of ours
            continue
        if folder not in FOLDER_MARKS and folder not in FAST_FOLDERS:
            raise pytest.UsageError(f"{item.nodeid}: a test's folder gives its tier; put it in one of tests/"
                                    f"{{{','.join([*FAST_FOLDERS, *FOLDER_MARKS])}}}/ (tests/conftest.py, FOLDER_MARKS)")
        for mark in FOLDER_MARKS.get(folder, ()):
            item.add_marker(mark)


def pytest_xdist_make_scheduler(config, log):
    """Spread the tests one by one over the workers, but each ``ONE_WORKER`` prefix as one unit.

    A scheduler of our own rather than ``xdist_group`` marks: with pytest 9.2 and pytest-xdist 3.8 the marks
    are ignored (xdist renames ``item._nodeid``, which pytest 9.2 no longer reads; measured: grouped tests
    ran in both workers).
    """
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((prefix for prefix in ONE_WORKER if nodeid.startswith(prefix)), nodeid)

    return OneWorkerGroups(config, log)


def _descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of ``root``, from /proc: by ancestry, not by name."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state, ppid = stat.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state not in ("Z", "X"):
            parent_of[int(entry)] = int(ppid)
    found, frontier = [], [root]
    while frontier:
        current = frontier.pop()
        children = [pid for pid, ppid in parent_of.items() if ppid == current]
        found += children
        frontier += children
    return found


def _reap_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# The result cache: no run in the suite may answer from another run's probe (fault-injection
# variables, for one, are not part of the cache key), nor touch the user's cache. Module-scoped
# fixtures run before any per-test fixture, so the session gets a folder of its own at import,
# every test another (isolated_cache), and every run_cli call a fresh one unless it names one.
_SESSION_CACHE = tempfile.TemporaryDirectory(prefix="isoprobe-test-cache-")
os.environ["ISOPROBE_CACHE_DIR"] = _SESSION_CACHE.name


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    """An empty result cache for this test; the runs it starts inherit ISOPROBE_CACHE_DIR."""
    directory = tmp_path_factory.mktemp("isoprobe-cache")
    monkeypatch.setenv("ISOPROBE_CACHE_DIR", str(directory))
    return directory


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """After every test, nothing started during it may still be alive (waits up to 3 s, then fails)."""
    before = set(_descendants(os.getpid()))
    yield
    deadline = time.monotonic() + 3
    while True:
        _reap_zombies()
        left = [pid for pid in _descendants(os.getpid()) if pid not in before]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes left alive after the test: {_describe(left)}"


def _describe(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid}: {command[:120]}")
        except OSError:
            out.append(str(pid))
    return "; ".join(out)


def marked_processes(name: str, value: str) -> list[str]:
    """Every live (non-zombie) process whose environment has ``name=value``, as 'pid state command'.

    Found by environment, not by ancestry: a process that left its session or was re-parented is found too.
    """
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if needle not in environ.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:160]
            with open(f"/proc/{entry}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            found.append(f"{entry} {state} {command}")
    return found


def wait_for(predicate, timeout: float):
    """Poll ``predicate`` every 50 ms until it returns something true or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict:
        return json.loads(self.stdout)


def run_cli(
    *args: str, timeout: float = 600, cwd: Path | None = None, cache_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> CliRun:
    """``python -m isoprobe ARGS`` in a fresh process, as a user (or a Slurm hook) runs it.

    With an empty result cache of its own unless ``cache_dir`` names one (the cache tests do).
    """
    environment = {**os.environ, **(env or {})}
    with tempfile.TemporaryDirectory(prefix="isoprobe-cache-") as fresh:
        environment["ISOPROBE_CACHE_DIR"] = str(cache_dir or fresh)
        done = subprocess.run(
            [sys.executable, "-m", "isoprobe", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or REPO,
            env=environment,
        )
    return CliRun(done.returncode, done.stdout, done.stderr)


def cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, cache_dir: Path | None = None,
) -> CliRun:
    """``isoprobe ARGS`` in this process: ``isoprobe.cli.main``, as ``run_cli`` runs it but without a new interpreter.

    For what needs no process of its own (validate, schema, help, show, mistakes refused before a
    trial): a fresh ``python -m isoprobe`` costs ~0.4 s of start-up, this a few milliseconds. It
    reproduces what a caller of the real command sees: stdout and stderr captured as text, the
    exit status (a ``SystemExit``, as argparse raises for --help and usage errors, becomes its
    code; an exception that escapes ``main`` becomes the interpreter's traceback on stderr and
    status 1), ``env`` on top of the environment, ``cwd`` (the repository by default) and an
    empty result cache of its own unless ``cache_dir`` names one. Everything it touches is put
    back afterwards: os.environ, the working folder, sys.path, sys.stdout/sys.stderr and the
    SIGINT/SIGTERM handlers (``isoprobe run`` installs one for SIGTERM).

    What it cannot show, use ``run_cli`` for: the modules a fresh interpreter imports, the
    interpreter's exit path (final flush, a closed pipe), signals sent from outside.
    """
    import contextlib
    import io
    import traceback

    from isoprobe.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    saved_environ = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_path = list(sys.path)
    saved_handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        with tempfile.TemporaryDirectory(prefix="isoprobe-cache-") as fresh:
            os.environ.update(env or {})
            os.environ["ISOPROBE_CACHE_DIR"] = str(cache_dir or fresh)
            os.chdir(cwd or REPO)
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                try:
                    returncode = main(list(args))
                except SystemExit as exit_:  # as the interpreter maps it: None is 0, a message is 1
                    if exit_.code is None or isinstance(exit_.code, int):
                        returncode = exit_.code or 0
                    else:
                        print(exit_.code, file=sys.stderr)
                        returncode = 1
                except KeyboardInterrupt:
                    raise
                except Exception:  # what `python -m isoprobe` would print before exiting 1
                    traceback.print_exc(file=sys.stderr)
                    returncode = 1
    finally:
        os.chdir(saved_cwd)
        for name in set(os.environ) - set(saved_environ):
            del os.environ[name]
        os.environ.update(saved_environ)
        sys.path[:] = saved_path
        for signum, handler in saved_handlers.items():
            if handler is not None:  # None: installed outside Python, cannot be put back from here
                signal.signal(signum, handler)
    return CliRun(int(returncode), stdout.getvalue(), stderr.getvalue())


@pytest.fixture
def write_spec(tmp_path):
    """Write a spec (a dict) as YAML and return its path."""

    def write(spec: dict, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    return write


def fault_spec(fault: str, *, at: int = 8, edge: int | None = None, start: int = 7, cap: int | None = 8,
               timeout: float = 60, state_dir: str | None = None, probability: float = 1.0,
               headroom: float | None = 0.0, **search) -> dict:
    """The fault scenarios' spec: tests/support/faults.py:faulty fits below ``at``, commits ``fault`` from it on.

    By default start 7, cap 8, fault at 8, one retry, one confirmation (asked for: the scenarios include a
    maximum that fails when it runs again; the product's default is none, issue 35), no headroom and no soak (so
    the recommendation is the maximum and costs no extra trial); ``headroom=None`` leaves the spec's default.
    """
    kwargs = {"fault": fault, "at": at, "edge": edge, "probability": probability, "state_dir": state_dir}
    spec = {
        "model": {"factory": f"{FAULTS}:faulty", "kwargs": kwargs},
        "input": {"shape": [16]},
        "target": {"classes": 4},
        "optimizer": {"name": "sgd"},
        # estimate off: each scenario is defined by where the search starts (the traced estimate would start
        # it at the edge it predicts, past the fault).
        "search": {"start_batch_size": start, "max_batch_size": cap, "steps": 2, "trial_timeout": timeout,
                   "estimate": False, "confirmations": 1, **search},
        "device": "cpu",
        "memory_budget": "2GiB",
    }
    spec["recommendation"] = {"soak_steps": 0, **({"headroom": headroom} if headroom is not None else {})}
    return spec


def cuda_resnet_spec(budget: str) -> dict:
    """The GPU tier's spec: resnet18 at 128x128, Adam, on CUDA under ``budget`` (tests/gpu)."""
    return {
        "model": {"torchvision": "resnet18", "kwargs": {"num_classes": 100}},
        "input": {"shape": [3, 128, 128]},
        "target": {"classes": 100},
        "optimizer": {"name": "adam"},
        "search": {"steps": 3, "start_batch_size": 16},
        "device": "cuda",
        "memory_budget": budget,
    }


def hog_spec(**search) -> dict:
    """A CPU spec around tests/support/models.py:memory_hog (~32 MiB of activations per sample); no soak
    (tests/unit/test_orchestration_soak.py and tests/integration/test_real_loop.py soak)."""
    return {
        "model": {"factory": f"{MODELS}:memory_hog", "kwargs": {"features": 524288, "depth": 8}},
        "input": {"shape": [524288]},
        "target": {"classes": 10},
        "optimizer": {"name": "sgd"},
        "search": {"steps": 2, "trial_timeout": 120, **search},
        "device": "cpu",
        "memory_budget": "1.5GiB",
        "recommendation": {"soak_steps": 0},
    }


def faulty_spec(fault: str, *, at: int, trial_timeout: float, **fault_kwargs) -> dict:
    """A tiny CPU spec around tests/support/faults.py:faulty: batches from ``at`` on do ``fault``; the search starts
    at 2."""
    return {
        "model": {"factory": f"{FAULTS}:faulty", "kwargs": {"fault": fault, "at": at, **fault_kwargs}},
        "input": {"shape": [16]},
        "target": {"classes": 4},
        "optimizer": {"name": "sgd"},
        "search": {"start_batch_size": 2, "steps": 2, "trial_timeout": trial_timeout, "estimate": False},
        "device": "cpu",
        "memory_budget": "2GiB",
        "recommendation": {"soak_steps": 0},
    }


def run_one_trial(spec: dict, batch: int, workdir: Path, budget: int) -> dict:
    """One trial of ``spec`` at ``batch`` in a fresh child under the CPU cap; its result event (it must fit).

    The child's ``TrialResult`` as a dict (``model_dump()``): a field the child left unset is None. A spec with
    ``training.eval_pass`` runs as an evaluation trial: the steps at ``batch``, then its evaluation pass at ``batch``.
    """
    from isoprobe.executors import Conditions
    from isoprobe.executors.local import run_once
    from isoprobe.pipeline.classify import classify_exit
    from isoprobe.protocol.messages import TrialRequest
    from isoprobe.spec.model import Spec

    request = TrialRequest(spec=Spec.model_validate(spec), batch_size=batch, device="cpu",
                           memory_budget_bytes=budget, python_path=[str(SUPPORT)],
                           eval_batch_size=batch if spec.get("training", {}).get("eval_pass") else None)
    run = run_once(request, Conditions(backend="cpu", memory_limit=budget), timeout=300, workdir=workdir)
    end = classify_exit(run)
    assert end.outcome.value == "fits", (end, end.result and end.result.error, run.stderr_tail[-2000:])
    return end.result.model_dump()


@pytest.fixture
def tiny_tmpdir():
    """A 16 KiB tmpfs: room for the environment check's files and a trial's, not for the next trial's request.

    Mounting needs root, as the suite has in CI; skipped otherwise.
    """
    folder = Path(tempfile.mkdtemp(prefix="isoprobe-tiny-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        folder.rmdir()


def refused_by_stand_in_srun(tmp_path: Path, srun_body: str):
    """The ProbeError a real ``SrunGangExecutor`` raises for one gang trial whose srun is a stand-in shell script
    (``srun_body``: what Slurm 22.05's srun says and does), where the machine has no Slurm."""
    from isoprobe.errors import ProbeError
    from isoprobe.executors import Conditions
    from isoprobe.executors.local import LocalExecutor
    from isoprobe.executors.srun_gang import SrunGangExecutor
    from isoprobe.protocol.messages import TrialRequest
    from isoprobe.spec.model import Spec

    slurm = tmp_path / "bin"
    slurm.mkdir()
    for name, body in (("srun", srun_body), ("scancel", "exit 0"), ("squeue", "exit 0")):
        (slurm / name).write_text(f"#!/bin/sh\n{body}\n")
        (slurm / name).chmod(0o755)
    raw = hog_spec()
    raw["distributed"] = {"strategy": "ddp", "world_size": 2, "launcher": "srun"}
    executor = SrunGangExecutor(LocalExecutor(warm=False), nodes=1, srun=str(slurm / "srun"),
                                scancel=str(slurm / "scancel"), squeue=str(slurm / "squeue"))
    with executor, pytest.raises(ProbeError) as refused:
        executor.run(TrialRequest(spec=Spec.model_validate(raw), batch_size=2, device="cpu"),
                     Conditions(backend="cpu"), timeout=30, name="refused")
    return refused.value


#: Set by benchmarks/gpu_check.py for the GPU tier: each failure printed the moment it happens. The tier runs
#: inside one device call with a hard limit, and pytest prints tracebacks only at the session's end: the first
#: real run (docs/gpu-runs/) was cut after 7 of 23 tests with one failure whose reason never came back.
FAILURES_NOW_ENV = "ISOPROBE_PRINT_FAILURES_NOW"


def pytest_runtest_logreport(report):
    if report.failed and os.environ.get(FAILURES_NOW_ENV):
        sys.stdout.write(f"\n--- {report.nodeid} failed ({report.when}):\n{report.longreprtext[-4000:]}\n---\n")
        sys.stdout.flush()
