"""The independent truth for a training command: its own edge under a CPU memory cap, without isoprobe.

    python benchmarks/harness/command_truth.py --budget 1GiB --steps 5 30 --low 2 --high 128 [--runs 2] \
        [--confirm 2] [--timeout 300] [--json FILE] -- \
        python tests/commands/plain_loop.py --batch-size {batch_size} --max-steps {max_steps}

Imports nothing of isoprobe, on purpose: it is the yardstick isoprobe's command source is checked
against. For each number of steps it runs the command (``{batch_size}`` and ``{max_steps}`` replaced
in every argument) in fresh processes under the conditions of isoprobe's CPU trials:

- ``RLIMIT_DATA`` soft = hard = budget, set in ``preexec_fn`` so that every process of the tree
  inherits it (torchrun's agent and ranks, DataLoader workers, a launcher's children: each one gets
  the budget, none shares it);
- environment ``MALLOC_MMAP_THRESHOLD_=131072`` (glibc then returns freed blocks, so the cap is
  repeatable), ``OMP_NUM_THREADS=1``, ``CUDA_VISIBLE_DEVICES=""``;
- its own session (``start_new_session=True``), stdout and stderr to files, a timeout.

At the end of each run the whole session is SIGKILLed; this process is a child subreaper
(``PR_SET_CHILD_SUBREAPER``), so a descendant that left the session (a daemon started with
``start_new_session=True``) is reparented here and killed too. A /proc scan then counts what is
left of the run (processes in its session, or orphans reparented here); the count is in the table.

Each run is classified:

- ``survived``: exit 0 and, where the command printed ``steps_run=N`` (every rank prints its own),
  every N equals the steps asked;
- ``oom``: a non-zero exit (or a timeout) with an allocation failure in stderr or stdout
  (MemoryError, "can't allocate memory", "Cannot allocate memory", DefaultCPUAllocator,
  OutOfMemoryError, std::bad_alloc): under torchrun the failing rank's traceback is in the output;
- ``error``: anything else (its tail is printed). An error is never counted as fitting or not: the
  search stops there and the edge is reported unknown (exit code 3).

The edge is found by bisection between ``--low`` (must survive) and ``--high`` (must run out), both
checked first. A batch survives only if all ``--runs`` runs do. After the bisection, ``--confirm M``
runs the edge and the batch above it M more times each; a disagreement is reported (exit code 4),
and an edge that runs out in one of them steps down to the batch below (confirmed the same way), so
the edge printed is a batch none of whose runs ran out.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36

OOM_PATTERNS = re.compile(
    r"MemoryError|can't allocate memory|cannot allocate memory|DefaultCPUAllocator|OutOfMemoryError"
    r"|std::bad_alloc",
    re.IGNORECASE,
)
STEPS_RUN = re.compile(r"steps_run=(\d+)")
STEP_TIME = re.compile(r"step_time_s=([0-9.]+|nan)")

ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def exports_of(lines: str) -> dict[str, str]:
    """What ``eval "$(isoprobe ... --format env)"`` exports, read as the shell reads it: ``run_once``'s ``exported``."""
    exported = {}
    for line in lines.splitlines():
        words = shlex.split(line)
        if words and words[0] == "export":
            name, _, value = words[1].partition("=")
            exported[name] = value
    return exported


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B?|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 768MiB, 1.5GiB)")
    unit = (m.group(2) or "B").upper().rstrip("B").rstrip("I")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
    return int(float(m.group(1)) * mult)


@dataclass
class Run:
    batch: int
    steps: int
    outcome: str  # survived | oom | error
    returncode: int | None
    wall_s: float
    steps_run: list[int] = field(default_factory=list)
    step_time_s: list[float] = field(default_factory=list)
    left_after_kill: int = 0
    escaped_session: int = 0
    reason: str = ""
    oom_lines: list[str] = field(default_factory=list)
    tail: str = ""


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, session id) of a process, from /proc/PID/stat; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[3])


def _members(sid: int) -> tuple[list[int], list[int]]:
    """Live processes of session ``sid``, and live orphans reparented to us (children we did not start)."""
    me = os.getpid()
    in_session, orphans = [], []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        stat = _proc_stat(pid)
        if stat is None:
            continue
        try:
            state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z":
            continue
        ppid, psid = stat
        if psid == sid:
            in_session.append(pid)
        elif ppid == me and pid != sid:
            orphans.append(pid)
    return in_session, orphans


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_all(sid: int) -> tuple[int, int]:
    """SIGKILL the run's session and the orphans reparented to us; return (left, escaped) counts."""
    _, escaped_before = _members(sid)
    for _ in range(50):
        in_session, orphans = _members(sid)
        if not in_session and not orphans:
            break
        try:
            os.killpg(sid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in in_session + orphans:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
        _reap()
    _reap()
    in_session, orphans = _members(sid)
    return len(in_session) + len(orphans), len(escaped_before)


def classify(returncode: int | None, timed_out: bool, stdout: str, stderr: str, steps: int) -> tuple[str, str]:
    if timed_out or returncode != 0:
        hit = OOM_PATTERNS.search(stderr + "\n" + stdout)
        if hit:
            return "oom", f"exit {returncode}, allocation failure in output: {hit.group(0)!r}"
        if timed_out:
            return "error", "timed out"
        return "error", f"exit code {returncode} with no allocation failure in its output"
    counts = [int(n) for n in STEPS_RUN.findall(stdout)]
    if counts and any(n != steps for n in counts):
        return "error", f"exited 0 after steps_run={counts}, asked for {steps}"
    return "survived", "exit 0" + (f", steps_run={counts}" if counts else " (no steps_run line)")


def run_once(template: list[str], batch: int, steps: int, budget: int, timeout: float, workdir: Path,
             keep: Path | None = None, exported: dict[str, str] | None = None) -> Run:
    """One run; ``exported``: the variables a hook exported with the answer (``isoprobe ... --format env``), which
    replace this harness's own malloc setting: the job as the hook leaves it, with nothing of the harness's added
    but the thread count and the hidden GPUs."""
    argv = [a.replace("{batch_size}", str(batch)).replace("{max_steps}", str(steps)) for a in template]
    if exported is None:
        env = dict(os.environ, **ENV)
    else:
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
        env.update({k: v for k, v in ENV.items() if k != "MALLOC_MMAP_THRESHOLD_"}, **exported)

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (budget, budget))

    out_path = workdir / f"b{batch}_s{steps}_{time.monotonic_ns()}.out"
    err_path = out_path.with_suffix(".err")
    started = time.perf_counter()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                preexec_fn=preexec, start_new_session=True)
    timed_out = False
    try:
        returncode: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out, returncode = True, None
    wall = time.perf_counter() - started
    left, escaped = _kill_all(proc.pid)
    if returncode is None:
        proc.wait()
    stdout = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")
    outcome, reason = classify(returncode, timed_out, stdout, stderr, steps)
    times = [float(t) for t in STEP_TIME.findall(stdout) if t != "nan"]
    tail = "" if outcome == "survived" else "\n".join((stderr or stdout).strip().splitlines()[-25:])
    # Where it ran out: under torchrun the last lines are the launcher's summary, not the rank's error.
    oom_lines = [] if outcome != "oom" else [
        line.strip()[:300] for line in (stderr + "\n" + stdout).splitlines() if OOM_PATTERNS.search(line)][:6]
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for path in (out_path, err_path):
            (keep / path.name).write_bytes(path.read_bytes())
    return Run(batch, steps, outcome, returncode, round(wall, 2), [int(n) for n in STEPS_RUN.findall(stdout)],
               times, left, escaped, reason, oom_lines, tail)


class Probe:
    def __init__(self, template, budget, timeout, workdir, log, keep=None) -> None:
        self.template, self.budget, self.timeout, self.workdir, self.log = template, budget, timeout, workdir, log
        self.keep = keep
        self.runs: list[Run] = []

    def batch(self, batch: int, steps: int, runs: int) -> str:
        """'survived' if all ``runs`` runs survived, 'oom' if none errored and one ran out, else 'error'."""
        outcomes = []
        for _ in range(runs):
            r = run_once(self.template, batch, steps, self.budget, self.timeout, self.workdir, self.keep)
            self.runs.append(r)
            self.log(f"  batch {batch:4d} steps {steps:3d}: {r.outcome:8s} {r.wall_s:6.1f} s"
                     f"  step {(sum(r.step_time_s) / len(r.step_time_s)) if r.step_time_s else float('nan'):.3f} s"
                     f"  left {r.left_after_kill} escaped {r.escaped_session}  ({r.reason})")
            for line in r.oom_lines[:2]:
                self.log(f"    at: {line}")
            if r.outcome == "error":
                self.log("    tail:\n" + "\n".join("    | " + line for line in r.tail.splitlines()))
                return "error"
            outcomes.append(r.outcome)
            if r.outcome == "oom":
                break  # one failure decides that the batch does not survive
        return "survived" if all(o == "survived" for o in outcomes) else "oom"


def find_edge(probe: Probe, steps: int, low: int, high: int, runs: int, confirm: int) -> dict:
    result: dict = {"steps": steps, "edge": None, "status": "ok", "disagreements": []}
    for b, want in ((low, "survived"), (high, "oom")):
        got = probe.batch(b, steps, runs)
        if got != want:
            result["status"] = f"bracket: batch {b} {got}, expected {want}"
            return result
    while high - low > 1:
        mid = (low + high) // 2
        got = probe.batch(mid, steps, runs)
        if got == "error":
            result["status"] = f"error at batch {mid}"
            return result
        low, high = (mid, high) if got == "survived" else (low, mid)
    # Confirmation: the batch above must run out every time; the edge must survive every time, else
    # the edge steps down (a batch survives only if all its runs do) and the new edge is confirmed too.
    for _ in range(confirm):
        got = probe.batch(low + 1, steps, 1)
        if got != "oom":
            result["disagreements"].append({"batch": low + 1, "expected": "oom", "got": got})
    edge = low
    while edge >= 1:
        failed = None
        for _ in range(confirm):
            got = probe.batch(edge, steps, 1)
            if got != "survived":
                failed = got
                result["disagreements"].append({"batch": edge, "expected": "survived", "got": got})
                break
        if failed is None:
            break
        if failed == "error":
            result["status"] = f"error at batch {edge}"
            return result
        edge -= 1
    result["edge"] = edge if edge >= 1 else None
    if result["disagreements"]:
        result["status"] = "runs disagree near the edge: " + ", ".join(
            f"{d['batch']} {d['got']}" for d in result["disagreements"])
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=parse_size, required=True, help="RLIMIT_DATA per process, e.g. 1GiB")
    p.add_argument("--steps", type=int, nargs="+", default=[5, 30])
    p.add_argument("--low", type=int, required=True, help="a batch that survives")
    p.add_argument("--high", type=int, required=True, help="a batch that runs out of memory")
    p.add_argument("--runs", type=int, default=1, help="runs per probed batch (all must survive)")
    p.add_argument("--confirm", type=int, default=0, help="extra runs of the edge and edge+1 after the search")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--json", type=Path, help="write the runs and edges here")
    p.add_argument("--keep-logs", type=Path, help="copy every run's stdout and stderr into this folder")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS... with {batch_size} and {max_steps}")
    args = p.parse_args(argv)
    template = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not template or not any("{batch_size}" in a for a in template):
        p.error("give the command after --, with {batch_size} in one of its arguments")
    if not any("{max_steps}" in a for a in template):
        p.error("the command needs {max_steps}: the truth is the script's own run to its max steps")

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("warning: PR_SET_CHILD_SUBREAPER failed; escaped daemons are not caught", file=sys.stderr)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    load = os.getloadavg()
    log(f"command: {shlex.join(template)}")
    log(f"budget {args.budget / 2**20:.0f} MiB per process, runs {args.runs}, confirm {args.confirm}, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    started = time.perf_counter()
    edges = []
    with tempfile.TemporaryDirectory(prefix="command_truth_") as tmp:
        probe = Probe(template, args.budget, args.timeout, Path(tmp), log, args.keep_logs)
        for steps in args.steps:
            log(f"steps {steps}:")
            edges.append(find_edge(probe, steps, args.low, args.high, args.runs, args.confirm))
    total = time.perf_counter() - started

    print(f"\n{'steps':>5} {'edge':>5} {'wall at edge (s)':>17} {'step at edge (s)':>17} {'left':>4}  status")
    for e in edges:
        at_edge = [r for r in probe.runs if r.steps == e["steps"] and r.batch == e["edge"] and r.outcome == "survived"]
        wall = min((r.wall_s for r in at_edge), default=float("nan"))
        st = [t for r in at_edge for t in r.step_time_s]
        e["wall_at_edge_s"] = wall
        e["step_time_at_edge_s"] = round(sum(st) / len(st), 3) if st else None
        e["trials"] = sum(1 for r in probe.runs if r.steps == e["steps"])
        print(f"{e['steps']:>5} {str(e['edge']):>5} {wall:>17.1f} {e['step_time_at_edge_s'] or float('nan'):>17.3f} "
              f"{max((r.left_after_kill for r in probe.runs), default=0):>4}  {e['status']}")
    print(f"{len(probe.runs)} runs in {total:.0f} s; processes left after kill: "
          f"{sum(r.left_after_kill for r in probe.runs)}; escaped the session (caught): "
          f"{sum(r.escaped_session for r in probe.runs)}")
    if args.json:
        args.json.write_text(json.dumps({
            "command": template, "budget_bytes": args.budget, "runs_per_batch": args.runs,
            "confirm": args.confirm, "load_at_start": load, "total_s": round(total, 1),
            "edges": edges, "runs": [asdict(r) for r in probe.runs]}, indent=1) + "\n")
    if any(e["edge"] is None for e in edges):
        return 3
    if any(e["disagreements"] for e in edges):
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
