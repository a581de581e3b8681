"""isoprobe beside its peers, alternated on one model and one cap: answers, true edges, tries, wall and CPU seconds.

    python benchmarks/studies/peers.py [--rounds 2] [--budget BYTES] [--only plain,lightning,hf]
        [--isoprobe-python PATH] [--edges FILE | --no-edges] [--json FILE]

Issue 35's benchmark. The model is the held-out convnet (benchmarks/specs/heldout/convnet.py: three conv blocks
with batch norm, random 3xSIZExSIZE images, 10 classes, fused AdamW lr 1e-3, clipping to norm 1.0), defined
once and framed three ways; each framing is one comparison, its tools run one after the other in a fixed
order (A B C) in every round, so that a change of load hits them alike:

1. plain: isoprobe on ``specs/heldout/convnet-plain.yaml`` (the factory, batch maker and the loop's own step);
   Accelerate's ``find_executable_batch_size`` (``accelerate.utils``: from ``--accelerate-start``, 128 by
   default, the batch times 0.9 after each out-of-memory error, in one process) around the plain loop
   (``convnet.train``: a DataLoader and the same step); Lightning's binsearch on the LightningModule;
2. Lightning: isoprobe on ``specs/heldout/convnet-lightning.yaml`` (``model.lightning``); Lightning's
   ``Tuner.scale_batch_size(mode="binsearch")``, what ``BatchSizeFinder`` runs, with its defaults (from 2,
   ``--peer-steps`` steps a try, 25 tries at most, a 5 % margin at the end), in one process;
3. Hugging Face: isoprobe on ``specs/heldout/convnet-peers-trainer.yaml`` (``model.hf_trainer``); the same
   Trainer with ``auto_find_batch_size=True`` from ``--auto-find-from`` (Accelerate's finder inside the
   Trainer), in one process.

A peer's run ends when its answer has trained ``--peer-steps`` steps (Lightning's ``steps_per_trial``
default, 3). isoprobe runs as a user runs it: ``PYTHON -m isoprobe run SPEC --no-cache --memory-budget
BYTES --format json`` with ``--isoprobe-python`` (default: this interpreter) from a scratch directory, so
the checkout tested is whichever that interpreter imports (printed, with a fingerprint of its sources).
Every tool run is a fresh process from a fresh interpreter, imports included. Every process this starts
runs at ``OMP_NUM_THREADS=1``; each peer's process under ``RLIMIT_DATA`` = ``--budget`` (set before exec,
with ``MALLOC_MMAP_THRESHOLD_`` and no CUDA, as isoprobe's CPU trials run; the harnesses
lightning_edge.py and hf_trainer_edge.py write these values out and their trial scripts are reused here).
isoprobe's own process is not capped: it caps its trials.

**The true steady edge** of each framing is measured once, without isoprobe and untimed: fresh plain
processes under the same cap, each training ``--edge-steps`` (30) steps of the framing's own loop
(``convnet.train``; ``trainer.fit`` with ``max_steps``: lightning_edge.py; ``trainer.train()`` with
``max_steps``: hf_trainer_edge.py), bisected (plain_edge.py's ``bisect_edge``, doubling from
``--edge-start``). ``--edge-recheck`` runs the edge and the edge plus one once more, each in a fresh process.
``--edges FILE`` takes the edges from an earlier ``--json`` instead (they do not depend on isoprobe).

**What the times count.** Wall: from the start of the tool's process to its end and the end of every
process below it. CPU: user + system seconds from ``getrusage(RUSAGE_CHILDREN)`` before and after the run.
The kernel adds a process's CPU time, and that of every descendant it has reaped, to its parent when the
parent reaps it, so this counts the tool's process and every process below it whose chain of waits reaches
this harness: isoprobe's trials are reaped by their keepers, the keepers by the fork server (or by isoprobe
for spawned trials), the fork server by its keeper, that keeper by isoprobe. This process is made a child
subreaper (``PR_SET_CHILD_SUBREAPER``), so a process orphaned below the tool (a keeper isoprobe left running
when it exited) comes to it, and it reaps every such process before reading the counters (counted in
"orphans"); a process still alive after ``--orphan-wait`` seconds is killed, and its time is not counted.
Not counted: this harness's own CPU (reading the pipes, the tables) and a descendant that was reparented
past this process (none can be: it is the subreaper nearest to the tool). The check: each run's processes
are also put in a cgroup v2 of their own (``/sys/fs/cgroup/unified`` on these machines) whose ``cpu.stat``
counts every process in it, reaped or not; the two sums are printed side by side ("cgroup check"; where no
writable cgroup v2 exists it says so). For isoprobe the sum of its trials' own wall seconds is printed too.

**isoprobe's phases** come from its result and its stderr, each line of which is time-stamped as it
arrives (and echoed on stderr): start-up (the interpreter and isoprobe's imports, until its first line),
the environment check (until the first trial started: that trial's line time minus its ``seconds``),
every trial (purpose, batch, steps, outcome, ``seconds``), the gaps between trials (a trial's start minus
the previous trial's line) and the end (last trial's line to exit). A pause on stderr over 2 s that no trial
accounts for is listed with the line before it. Where the trial lines cannot be read (another output format),
only the result's totals are used.

Output: markdown tables on stdout (answers and medians, the ratios isoprobe / fastest peer per round,
isoprobe's phases and trials per purpose, the CPU check, the true edges); progress on stderr; ``--json FILE``
keeps every number, every run and every time-stamped line of isoprobe's stderr.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
HELDOUT = BENCHMARKS / "specs" / "heldout"
sys.path.insert(0, str(BENCHMARKS / "harness"))
os.environ["OMP_NUM_THREADS"] = "1"  # before anything starts a process: every process inherits it

import hf_trainer_edge as hf  # noqa: E402
import lightning_edge as lit  # noqa: E402
from plain_edge import bisect_edge  # noqa: E402
from isoprobe.spec.load import load_spec  # noqa: E402 - the specs are read here; no tool run imports this one

SPECS = {"plain": HELDOUT / "convnet-plain.yaml", "lightning": HELDOUT / "convnet-lightning.yaml",
         "hf": HELDOUT / "convnet-peers-trainer.yaml"}
VERSIONS = ("torch", "lightning", "transformers", "accelerate")
PR_SET_CHILD_SUBREAPER = 36
CGROUP_ROOT = Path("/sys/fs/cgroup/unified")
#: A pause on isoprobe's stderr longer than this, which no trial's own time accounts for, is reported.
PAUSE_SECONDS = 2.0
TRIAL_LINE = re.compile(r"^isoprobe: trial\s+(\d+)\s+batch\s+(\d+)")

#: The plain loop at one batch, for the plain framing's true edge: ``convnet.train`` and nothing else imported.
PLAIN_TRIAL = r"""
import json, sys
config = json.loads(sys.argv[1])
import importlib.util
spec = importlib.util.spec_from_file_location("convnet_loop", config["path"])
loop = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loop)
try:
    done = loop.train(config["batch"], config["steps"], **config["kwargs"])
    assert done == config["steps"], done
except (MemoryError, RuntimeError) as error:
    if isinstance(error, MemoryError) or "can't allocate memory" in str(error):
        sys.exit(3)
    raise
"""

#: Accelerate's finder around the same plain loop, as its documentation writes it: the decorated function builds
#: the model, optimizer and DataLoader at the batch it is given and trains; each call is one try.
ACCELERATE = r"""
import json, sys, time
config = json.loads(sys.argv[1])
started = time.perf_counter()
import importlib.util
from accelerate.utils import find_executable_batch_size
spec = importlib.util.spec_from_file_location("convnet_loop", config["path"])
loop = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loop)
tried = []

@find_executable_batch_size(starting_batch_size=config["start"])
def train(batch_size):
    tried.append(batch_size)
    loop.train(batch_size, config["steps"], **config["kwargs"])
    return batch_size

found = train()
print(json.dumps({"answer": found, "tried": tried, "seconds": time.perf_counter() - started}))
"""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cpu_of(usage) -> float:
    return usage.ru_utime + usage.ru_stime


# --- running one process tree and counting all of it -------------------------------------------------------------

class Cgroup:
    """A cgroup v2 for one run: every process started in it stays in it, and ``cpu.stat`` counts them all."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def make(cls, name: str) -> Cgroup | None:
        if not (CGROUP_ROOT / "cgroup.procs").exists():
            return None
        path = CGROUP_ROOT / name
        try:
            path.mkdir()
        except OSError:
            return None
        return cls(path)

    def join(self) -> None:
        """In the child before exec (preexec_fn): move this process in."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def seconds(self, wait: float = 10.0) -> float | None:
        """CPU seconds of every process that ran in it, once none is left (None if some still run)."""
        deadline = time.monotonic() + wait
        while "populated 1" in (self.path / "cgroup.events").read_text():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return (int(stat["user_usec"]) + int(stat["system_usec"])) / 1e6

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def my_children() -> list[int]:
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:
            pass
    return pids


def reap_orphans(wait: float) -> dict:
    """Reap every process left below this one (orphans re-parented here); kill those still running after ``wait``."""
    reaped, killed = 0, 0
    deadline = time.monotonic() + wait
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return {"reaped": reaped, "killed": killed}
        if pid:
            reaped += 1
            continue
        if time.monotonic() > deadline:
            for child in my_children():
                try:
                    os.kill(child, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            deadline = float("inf")
        time.sleep(0.02)


def run_tree(argv: list[str], env: dict, cwd: str, label: str, cap: int | None = None, echo: bool = False,
             timeout: float = 3600.0, orphan_wait: float = 30.0) -> dict:
    """Run one tool as a fresh process; its stdout, its stderr lines with their arrival times (seconds from the
    start), wall seconds, and the CPU seconds of the whole tree (RUSAGE_CHILDREN delta, and the cgroup's)."""
    cgroup = Cgroup.make(f"isoprobe-peers-{os.getpid()}-{label}")

    def preexec() -> None:
        if cap is not None:
            resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
        if cgroup is not None:
            cgroup.join()

    try:
        return _run_tree(argv, env, cwd, cgroup, preexec, echo, timeout, orphan_wait)
    finally:
        if cgroup is not None:
            cgroup.remove()


def _run_tree(argv, env, cwd, cgroup, preexec, echo, timeout, orphan_wait) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, preexec_fn=preexec)
    out: list[bytes] = []
    lines: list[tuple[float, str]] = []

    def read_out() -> None:
        out.append(process.stdout.read())

    def read_err() -> None:
        for raw in process.stderr:
            at = time.perf_counter() - started
            line = raw.decode(errors="replace").rstrip("\n")
            lines.append((at, line))
            if echo:
                say(f"   [{at:7.2f}] {line}")

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for reader in readers:
        reader.start()
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait()
    for reader in readers:
        reader.join()
    ended = time.perf_counter()
    orphans = reap_orphans(orphan_wait)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cgroup_cpu = cgroup.seconds() if cgroup is not None else None
    return {"returncode": code, "stdout": b"".join(out).decode(errors="replace"), "stderr": lines,
            "wall": wall, "wall_to_exit": ended - started,
            "cpu": cpu_of(after) - cpu_of(before), "cpu_user": after.ru_utime - before.ru_utime,
            "cpu_system": after.ru_stime - before.ru_stime, "cgroup_cpu": cgroup_cpu, "orphans": orphans}


def peer_env() -> dict:
    """A peer's environment: what isoprobe's CPU trials run with (the harnesses' values), one thread."""
    env = hf.environment()
    env["OMP_NUM_THREADS"] = "1"
    return env


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])


# --- the tools ---------------------------------------------------------------------------------------------------

class Bench:
    def __init__(self, args):
        self.args = args
        self.budget = args.budget
        self.specs = {name: load_spec(str(path)) for name, path in SPECS.items()}
        plain = self.specs["plain"]
        self.loop_path = plain.model.factory.rsplit(":", 1)[0]  # convnet.py: its train() is the plain loop
        self.loop_kwargs = dict(plain.model.kwargs)
        self.lightning_config = lit.trial_config(self.specs["lightning"], 0, args.peer_steps)
        self.builder = self.specs["hf"].model.hf_trainer
        self.builder_kwargs = dict(self.specs["hf"].model.kwargs)
        self.scratch = tempfile.mkdtemp(prefix="isoprobe-peers-")  # isoprobe's cwd: its checkout, not this one
        self.count = 0

    def label(self, name: str) -> str:
        self.count += 1
        return f"{self.count}-{re.sub(r'[^a-z]+', '-', name)}"

    # isoprobe, as a user runs it
    def isoprobe(self, framing: str) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        argv = [self.args.isoprobe_python, "-m", "isoprobe", "run", str(SPECS[framing]), "--no-cache",
                "--memory-budget", str(self.budget), "--format", "json"]
        run = run_tree(argv, env, self.scratch, self.label(f"isoprobe {framing}"), echo=True,
                       orphan_wait=self.args.orphan_wait)
        row = measured_row(run)
        try:
            result = json.loads(run["stdout"])
        except ValueError:
            row.update(answer=None, error=f"exit {run['returncode']}: no JSON result:\n"
                                          f"{tail(chr(10).join(line for _, line in run['stderr']))}")
            return row
        trials = [{"index": t["index"], "batch": t["batch_size"], "purpose": t["purpose"], "outcome": t["outcome"],
                   "steps": len(t.get("step_seconds") or []), "seconds": t["seconds"],
                   "forked": t.get("forked"), "warm_start": t.get("warm_start")} for t in result["trials"]]
        margin = result.get("edge_margin") or {}
        row.update(answer=result.get("max_batch_size"), recommended=result.get("recommended_batch_size"),
                   tries=len(trials), trials=trials, total_seconds=result["total_seconds"],
                   stop_reason=result.get("stop_reason"), message=result.get("message"),
                   marginal=[m["batch_size"] for m in margin.get("marginal") or []],
                   first_failing=result.get("first_failing_batch_size"),
                   recommendation_note=(result.get("recommendation") or {}).get("note"),
                   trials_seconds=sum(t["seconds"] for t in trials),
                   phases=phases(run, result, trials), pauses=pauses(run["stderr"], trials),
                   stderr=[[round(at, 3), line] for at, line in run["stderr"]])
        return row

    def accelerate(self) -> dict:
        config = {"path": self.loop_path, "kwargs": self.loop_kwargs, "start": self.args.accelerate_start,
                  "steps": self.args.peer_steps}
        run = run_tree([self.args.python, "-c", ACCELERATE, json.dumps(config)], peer_env(), str(HELDOUT),
                       self.label("accelerate"), cap=self.budget, orphan_wait=self.args.orphan_wait)
        return peer_row(run, lambda found: {"answer": found["answer"], "tried": found["tried"]})

    def lightning(self) -> dict:
        run = run_tree([self.args.python, "-c", lit.FINDER, json.dumps(self.lightning_config)], lit.environment()
                       | {"OMP_NUM_THREADS": "1"}, "/tmp", self.label("lightning"), cap=self.budget,
                       orphan_wait=self.args.orphan_wait)

        def answer(found: dict) -> dict:
            margin = re.search(r"reducing batch size from (\d+) to (\d+)", "\n".join(l for _, l in run["stderr"]))
            return {"answer": found["answer"], "tried": found["tried"],
                    "before_margin": int(margin.group(1)) if margin else found["answer"]}

        return peer_row(run, answer)

    def auto_find(self) -> dict:
        config = {"builder": self.builder, "kwargs": self.builder_kwargs, "batch": self.args.auto_find_from,
                  "steps": self.args.peer_steps, "auto_find": True}
        run = run_tree([self.args.python, "-c", hf.TRIAL, json.dumps(config)], peer_env(),
                       str(Path(self.builder.rsplit(":", 1)[0]).parent), self.label("auto-find"), cap=self.budget,
                       orphan_wait=self.args.orphan_wait)
        return peer_row(run, lambda found: {"answer": found["batch"], "tried": found["tried"]})

    # the true steady edges: plain processes of each framing's own loop, untimed
    def fits(self, framing: str, batch: int, steps: int) -> bool:
        if framing == "plain":
            config = {"path": self.loop_path, "kwargs": self.loop_kwargs, "batch": batch, "steps": steps}
            run = subprocess.run([self.args.python, "-c", PLAIN_TRIAL, json.dumps(config)], env=peer_env(),
                                 cwd=str(HELDOUT), capture_output=True, text=True,
                                 preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (self.budget,) * 2))
        elif framing == "lightning":
            config = lit.trial_config(self.specs["lightning"], batch, steps)
            run = subprocess.run([self.args.python, "-c", lit.TRIAL, json.dumps(config)],
                                 env=lit.environment() | {"OMP_NUM_THREADS": "1"}, cwd="/tmp", capture_output=True,
                                 text=True,
                                 preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (self.budget,) * 2))
        else:
            run = hf.run_plain(self.builder, self.builder_kwargs, batch, self.budget, steps, python=self.args.python)
        if run.returncode not in (0, 3):
            raise RuntimeError(f"{framing} batch {batch}: the plain run failed (exit {run.returncode}):\n"
                               f"{tail(run.stderr, 30)}")
        return run.returncode == 0

    def edge(self, framing: str) -> dict:
        steps, tried = self.args.edge_steps, []
        started = time.perf_counter()

        def fits(batch: int, recheck: bool = False) -> bool:
            at = time.perf_counter()
            fit = self.fits(framing, batch, steps)
            tried.append({"batch": batch, "fits": fit, "seconds": round(time.perf_counter() - at, 1),
                          "recheck": recheck})
            say(f"   {framing} true edge: batch {batch:>4} {'trains' if fit else 'out_of_memory'} {steps} steps "
                f"({tried[-1]['seconds']} s)")
            return fit

        found = bisect_edge(fits, self.args.edge_start)
        recheck = None
        if self.args.edge_recheck and found:
            recheck = {"edge_fits": fits(found, True), "next_fits": fits(found + 1, True)}
        return {"edge": found, "steps": steps, "tried": tried, "recheck": recheck,
                "seconds": round(time.perf_counter() - started, 1)}


def measured_row(run: dict) -> dict:
    return {"wall": run["wall"], "cpu": run["cpu"], "cpu_user": run["cpu_user"], "cpu_system": run["cpu_system"],
            "cgroup_cpu": run["cgroup_cpu"], "orphans": run["orphans"], "returncode": run["returncode"]}


def peer_row(run: dict, read) -> dict:
    """A peer's answer from its last stdout line (a JSON object), with its times; the error's tail if none."""
    row = measured_row(run)
    try:
        found = json.loads(run["stdout"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        row.update(answer=None, tries=None,
                   error=f"exit {run['returncode']}: {tail(chr(10).join(l for _, l in run['stderr']))}")
        return row
    row.update(read(found))
    row["tries"] = len(row.get("tried") or []) or None
    return row


# --- isoprobe's phases, from its result and its time-stamped stderr ------------------------------------------------

def trial_lines(lines: list[tuple[float, str]]) -> dict[int, float]:
    """The arrival time of each trial's line on isoprobe's stderr, by trial index."""
    found = {}
    for at, line in lines:
        match = TRIAL_LINE.match(line)
        if match:
            found.setdefault(int(match.group(1)), at)
    return found


def phases(run: dict, result: dict, trials: list[dict]) -> list[dict]:
    """Where the run's wall time went: start-up, environment check, each trial, the gaps, the end."""
    lines, wall = run["stderr"], run["wall_to_exit"]
    at = trial_lines(lines)
    rows: list[dict] = []
    if not trials or any(t["index"] not in at for t in trials):  # another output format: the result's totals only
        rows.append({"phase": "outside the result's total_seconds (interpreter start, imports, exit)",
                     "seconds": wall - result["total_seconds"]})
        rows.append({"phase": "environment check, gaps and the end (total_seconds minus the trials' seconds)",
                     "seconds": result["total_seconds"] - sum(t["seconds"] for t in trials)})
        rows += [{"phase": f"trial {t['index']}", **t} for t in trials]
        return rows
    first_line = lines[0][0] if lines else 0.0
    first_start = at[trials[0]["index"]] - trials[0]["seconds"]
    rows.append({"phase": "start-up (interpreter, isoprobe's imports: until its first line)", "seconds": first_line})
    rows.append({"phase": "environment check (first line to the first trial's start)",
                 "seconds": first_start - first_line})
    previous = None
    for trial in trials:
        start = at[trial["index"]] - trial["seconds"]
        if previous is not None:
            rows.append({"phase": f"gap before trial {trial['index']}", "seconds": start - previous})
        rows.append({"phase": f"trial {trial['index']}", **trial})
        previous = at[trial["index"]]
    rows.append({"phase": "after the last trial (the answer, the result, exit)", "seconds": wall - previous})
    return rows


def pauses(lines: list[tuple[float, str]], trials: list[dict]) -> list[dict]:
    """Every pause over PAUSE_SECONDS between stderr lines (from the start), the line before it, and how much of it
    the trial whose line ended it accounts for (a trial runs silently: its own seconds are no pause)."""
    seconds = {t["index"]: t["seconds"] for t in trials}
    found, previous, before = [], 0.0, "(the process started)"
    for at, line in lines:
        gap = at - previous
        if gap > PAUSE_SECONDS:
            match = TRIAL_LINE.match(line)
            trial = int(match.group(1)) if match else None
            ran = min(gap, seconds.get(trial, 0.0)) if trial else 0.0
            found.append({"at": round(previous, 2), "seconds": round(gap, 2), "after": before, "ended_by": line,
                          "trial": trial, "trial_seconds": round(ran, 2), "unexplained": round(gap - ran, 2)})
        previous, before = at, line
    return found


# --- the rounds and the tables -----------------------------------------------------------------------------------

COMPARISONS = {
    "plain": [("isoprobe (plain spec)", lambda b: b.isoprobe("plain")),
              ("Accelerate find_executable_batch_size", lambda b: b.accelerate()),
              ("Lightning binsearch", lambda b: b.lightning())],
    "lightning": [("isoprobe (model.lightning)", lambda b: b.isoprobe("lightning")),
                  ("Lightning binsearch", lambda b: b.lightning())],
    "hf": [("isoprobe (model.hf_trainer)", lambda b: b.isoprobe("hf")),
           ("auto_find_batch_size", lambda b: b.auto_find())],
}
#: Which true edge each tool's answer is held to: the loop it trains.
LOOP = {"isoprobe (plain spec)": "plain", "Accelerate find_executable_batch_size": "plain",
        "Lightning binsearch": "lightning", "isoprobe (model.lightning)": "lightning",
        "isoprobe (model.hf_trainer)": "hf", "auto_find_batch_size": "hf"}
FRAMING = {"plain": "plain loop", "lightning": "`trainer.fit`", "hf": "`Trainer.train()`"}


def isoprobe_checkout(python: str, cwd: str) -> dict:
    """Which isoprobe the interpreter imports from ``cwd``, and a fingerprint of its sources (not git: any copy)."""
    probe = subprocess.run([python, "-c", "import isoprobe, json; print(json.dumps({'file': isoprobe.__file__, "
                            "'version': getattr(isoprobe, '__version__', None)}))"],
                           cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    if probe.returncode != 0:
        raise SystemExit(f"--isoprobe-python {python} cannot import isoprobe:\n{tail(probe.stderr)}")
    found = json.loads(probe.stdout)
    package = Path(found["file"]).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    found["sources_sha256"] = digest.hexdigest()[:16]
    return found


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def tables(measured: dict) -> str:
    runs, edges = measured["runs"], measured["edges"]
    out = ["## Answers and times (medians over the rounds)", "",
           "| framing | tool | answers | true steady edge | = edge | tries | wall s | CPU s | CPU s, cgroup check |",
           "|---|---|---|---|---|---|---|---|---|"]
    for framing in measured["framings"]:
        for name, _ in COMPARISONS[framing]:
            rows = [r for r in runs if r["framing"] == framing and r["tool"] == name]
            answers = [r.get("answer") for r in rows]
            edge = (edges.get(LOOP[name]) or {}).get("edge")
            equal = "-" if edge is None else ("yes" if all(a == edge for a in answers) else
                                              "no (" + ", ".join(f"{(a or 0) - edge:+d}" for a in answers) + ")")
            out.append(f"| {FRAMING[framing]} | {name} | {', '.join(str(a) for a in answers)} | "
                       f"{edge if edge is not None else '-'} ({FRAMING[LOOP[name]]}) | {equal} | "
                       f"{fmt(median(r.get('tries') for r in rows), 0)} | {fmt(median(r['wall'] for r in rows))} | "
                       f"{fmt(median(r['cpu'] for r in rows))} | {fmt(median(r['cgroup_cpu'] for r in rows))} |")
    out += ["", "## isoprobe / fastest peer, per round (the tools of a framing ran one after the other)", "",
            "| framing | round | isoprobe wall s | fastest peer by wall | wall ratio | isoprobe CPU s | "
            "fastest peer by CPU | CPU ratio |", "|---|---|---|---|---|---|---|---|"]
    for framing in measured["framings"]:
        ratios = {"wall": [], "cpu": []}
        for round_ in range(1, measured["rounds"] + 1):
            rows = [r for r in runs if r["framing"] == framing and r["round"] == round_]
            mine = next(r for r in rows if r["tool"].startswith("isoprobe"))
            peers = [r for r in rows if not r["tool"].startswith("isoprobe")]
            cells = []
            for key in ("wall", "cpu"):
                best = min(peers, key=lambda r: r[key])
                ratios[key].append(mine[key] / best[key])
                cells += [fmt(mine[key]), f"{best['tool']} {fmt(best[key])}", f"{mine[key] / best[key]:.2f}"]
            out.append(f"| {FRAMING[framing]} | {round_} | " + " | ".join(cells) + " |")
        out.append(f"| {FRAMING[framing]} | median | | | {median(ratios['wall']):.2f} | | | "
                   f"{median(ratios['cpu']):.2f} |")
    out += ["", "## Peers' tries", ""]
    for r in runs:
        if not r["tool"].startswith("isoprobe"):
            extra = (f" (before its 5 % margin: {r['before_margin']})"
                     if r.get("before_margin") not in (None, r.get("answer")) else "")
            what = ", ".join(map(str, r.get("tried") or [])) or r.get("error", "")[-300:]
            out.append(f"- round {r['round']}, {FRAMING[r['framing']]}, {r['tool']}: {r.get('answer')} after "
                       f"{what}{extra}")
    out += ["", "## isoprobe's phases", ""]
    for r in runs:
        if not r["tool"].startswith("isoprobe") or "phases" not in r:
            continue
        purposes: dict[str, list[float]] = {}
        for trial in r["trials"]:
            purposes.setdefault(trial["purpose"], []).append(trial["seconds"])
        gaps = sum(p["seconds"] for p in r["phases"] if p["phase"].startswith(("gap", "after the last")))
        out += [f"**Round {r['round']}, {FRAMING[r['framing']]}**: max {r['answer']}, recommended "
                f"{r.get('recommended')}; {r['tries']} trials: "
                + ", ".join(f"{k} {len(v)} ({sum(v):.1f} s)" for k, v in purposes.items())
                + f"; wall {r['wall']:.1f} s, CPU {r['cpu']:.1f} s; the result's total_seconds {r['total_seconds']:.1f}"
                f" minus the trials' seconds and the gaps and end below (before the first trial, by the result): "
                f"{r['total_seconds'] - r['trials_seconds'] - gaps:.1f} s"
                + (f"; marginal: {r['marginal']}" if r.get("marginal") else "")
                + (f"; first failing {r['first_failing']}" if r.get("first_failing") else ""), "",
                "| phase | purpose | batch | steps | outcome | seconds |", "|---|---|---|---|---|---|"]
        for phase in r["phases"]:
            out.append(f"| {phase['phase']} | {phase.get('purpose', '')} | {phase.get('batch', '')} | "
                       f"{phase.get('steps', '')} | {phase.get('outcome', '')} | {phase['seconds']:.1f} |")
        silent = [p for p in r["pauses"] if p["unexplained"] > PAUSE_SECONDS]
        raw = len(r["pauses"])
        out.append("")
        out.append(f"Pauses on stderr over {PAUSE_SECONDS:.0f} s: {raw}, of which {len(silent)} not accounted for by "
                   f"the trial whose line ended it" + (":" if silent else "."))
        for p in silent:
            out.append(f"- {p['seconds']:.1f} s at {p['at']:.1f} s ({p['unexplained']:.1f} s unexplained), after "
                       f"`{p['after'][:160]}`, ended by `{p['ended_by'][:120]}`")
        out.append("")
    out += ["## CPU accounting check (every run)", "",
            "| round | tool | wall s | CPU s (RUSAGE_CHILDREN) | CPU s (cgroup) | difference | orphans reaped | "
            "trials' own wall s (sum) |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        diff = None if r["cgroup_cpu"] is None else r["cpu"] - r["cgroup_cpu"]
        out.append(f"| {r['round']} | {r['tool']} | {r['wall']:.1f} | {r['cpu']:.2f} | {fmt(r['cgroup_cpu'], 2)} | "
                   f"{fmt(diff, 2)} | {r['orphans']['reaped']}"
                   + (f" (killed {r['orphans']['killed']})" if r["orphans"]["killed"] else "")
                   + f" | {fmt(r.get('trials_seconds'))} |")
    out += ["", "## True steady edges (plain processes, untimed against anything)", ""]
    for loop, found in edges.items():
        if found is None:
            continue
        tried = ", ".join(f"{t['batch']} {'fits' if t['fits'] else 'OOM'}" for t in found["tried"]
                          if not t.get("recheck"))
        recheck = ""
        if found.get("recheck"):
            recheck = (f"; rechecked: {found['edge']} {'fits' if found['recheck']['edge_fits'] else 'OOM'}, "
                       f"{found['edge'] + 1} {'fits' if found['recheck']['next_fits'] else 'OOM'}")
        out.append(f"- {FRAMING[loop]}: **{found['edge']}** ({found['steps']} steps a run; {tried}{recheck}; "
                   f"{found['seconds']} s{', from ' + found['source'] if found.get('source') else ''})")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the alternated runs (default 1)")
    parser.add_argument("--budget", type=int, default=1280 * 2**20,
                        help="the cap in bytes: RLIMIT_DATA of each peer and plain run, isoprobe's --memory-budget "
                             "(default 1280 MiB)")
    parser.add_argument("--only", default="plain,lightning,hf", help="comma-separated framings to run")
    parser.add_argument("--isoprobe-python", default=sys.executable,
                        help="the interpreter that runs isoprobe; its checkout is the one tested")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the peers and plain runs")
    parser.add_argument("--peer-steps", type=int, default=3, help="steps a peer's try trains (default 3)")
    parser.add_argument("--accelerate-start", type=int, default=128, help="find_executable_batch_size's start")
    parser.add_argument("--auto-find-from", type=int, default=128, help="auto_find_batch_size's first batch")
    parser.add_argument("--edge-steps", type=int, default=30, help="steps of each true-edge run (default 30)")
    parser.add_argument("--edge-start", type=int, default=16, help="the first batch the true-edge bisection tries")
    parser.add_argument("--edge-recheck", action="store_true", help="run the edge and edge+1 once more each")
    parser.add_argument("--edges", metavar="FILE", help="the true edges from an earlier --json (not measured again)")
    parser.add_argument("--no-edges", action="store_true", help="measure no true edge")
    parser.add_argument("--orphan-wait", type=float, default=30.0,
                        help="seconds to wait for processes left below a tool before killing them")
    parser.add_argument("--json", metavar="FILE", help="write every number measured here as JSON")
    args = parser.parse_args()
    framings = [f.strip() for f in args.only.split(",") if f.strip()]
    unknown = set(framings) - set(COMPARISONS)
    if unknown or not framings:
        parser.error(f"--only: unknown framing {sorted(unknown)}; choose from {', '.join(COMPARISONS)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    loops = sorted({LOOP[name] for framing in framings for name, _ in COMPARISONS[framing]},
                   key=list(COMPARISONS).index)
    edges: dict = {}
    if args.edges:
        for loop, found in earlier_edges(args.edges, args.budget).items():
            if loop in loops:
                edges[loop] = found
    libc = ctypes.CDLL(None, use_errno=True)
    subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    bench = Bench(args)
    checkout = isoprobe_checkout(args.isoprobe_python, bench.scratch)
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    say(f"isoprobe under test: {checkout}; load: {load_before}")
    started = time.perf_counter()
    runs = []
    for round_ in range(1, args.rounds + 1):
        for framing in framings:
            for name, run in COMPARISONS[framing]:
                say(f"-- round {round_}, {framing}: {name} ...")
                row = run(bench)
                row.update(round=round_, framing=framing, tool=name)
                runs.append(row)
                say(f"-- round {round_}, {framing}: {name}: answer {row.get('answer')}, tries {row.get('tries')}, "
                    f"wall {row['wall']:.1f} s, CPU {row['cpu']:.1f} s (cgroup {fmt(row['cgroup_cpu'])})"
                    + (f"\n{row['error']}" if row.get("error") else ""))
    if not args.no_edges:
        for loop in loops:
            if loop not in edges:
                say(f"-- true steady edge, {FRAMING[loop]} ({args.edge_steps} steps a run) ...")
                edges[loop] = bench.edge(loop)
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    measured = {"command": "python " + shlex.join(["benchmarks/studies/peers.py", *sys.argv[1:]]),
                "date": f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}", "budget": args.budget,
                "rounds": args.rounds, "framings": framings, "peer_steps": args.peer_steps,
                "edge_steps": args.edge_steps, "isoprobe": checkout, "isoprobe_python": args.isoprobe_python,
                "python": args.python, "subreaper": subreaper,
                "cgroup": (CGROUP_ROOT / "cgroup.procs").exists(),
                "image_size": _image_size(), "load_before": load_before, "load_after": load_after,
                "versions": {name: importlib.metadata.version(name) for name in VERSIONS},
                "machine": f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                "runs": runs, "edges": edges, "total_seconds": time.perf_counter() - started}
    print(f"command: {measured['command']}\ndate: {measured['date']}\n"
          f"model: benchmarks/specs/heldout/convnet.py, 3x{measured['image_size']}x{measured['image_size']} images; "
          f"cap {args.budget} bytes ({args.budget / 2**20:.0f} MiB), device cpu, OMP_NUM_THREADS=1, "
          f"peers train {args.peer_steps} steps a try\n"
          f"isoprobe: {checkout['file']} (sources {checkout['sources_sha256']}), run by {args.isoprobe_python}\n"
          f"machine: {measured['machine']}; versions: "
          f"{', '.join(f'{k} {v}' for k, v in measured['versions'].items())}\n"
          f"load before: {load_before}\nload after:  {load_after}\n"
          f"CPU counting: subreaper {'on' if subreaper else 'OFF'}, cgroup check "
          f"{'on' if measured['cgroup'] else 'unavailable'}\ntotal: {measured['total_seconds']:.0f} s\n")
    print(tables(measured))
    if args.json:
        Path(args.json).write_text(json.dumps(measured, indent=1))
    return 0


def earlier_edges(path: str, budget: int) -> dict:
    """The true edges of an earlier ``--json``, refused where its cap or image size differ from this run's."""
    earlier = json.loads(Path(path).read_text())
    if earlier.get("budget") != budget or earlier.get("image_size") != _image_size():
        raise SystemExit(f"--edges {path}: measured at cap {earlier.get('budget')} and image size "
                         f"{earlier.get('image_size')}, this run is at {budget} and {_image_size()}: measure them again")
    return {loop: {**found, "source": path} for loop, found in earlier["edges"].items() if found}


def _image_size() -> int | None:
    match = re.search(r"^SIZE = (\d+)", (HELDOUT / "convnet.py").read_text(), re.M)
    return int(match.group(1)) if match else None


if __name__ == "__main__":
    sys.exit(main())
