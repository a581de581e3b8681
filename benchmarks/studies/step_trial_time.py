"""Where a gang trial's time goes when it runs as a Slurm job step, per phase, seen from outside isoprobe.

    # inside an allocation (sbatch -N2 --ntasks-per-node=1 ...), with this checkout on PYTHONPATH:
    python benchmarks/studies/step_trial_time.py SPEC [--json] [--set distributed.steps_ahead=true]

Runs ``isoprobe run SPEC --no-cache`` (the spec's ``distributed.launcher`` srun, or auto in a job of
several nodes) with a fresh TMPDIR of its own, and watches that folder every 5 ms from this process: each
step folder (``trialNNN-bB.step``, made when the trial is due; or ``aheadNNN.step``, a step started while
the trial before it ran, ``distributed.steps_ahead``), the trial it ran (``trial.json``, written with the ranks'
requests; a folder without it ran the trial its name says, requests written before srun), each rank's
``task.json`` (srun_rank writes it first thing, before the child imports anything), the ranks' events
(every event carries its wall-clock time: ``warm`` when the child's imports are done, ``result`` its
verdict) and srun's own process (found in /proc by the step's folder on its command line). Per trial,
from the moment its requests are written (the trial is due):

- **wait**: requests written -> every rank warm (srun, slurmctld's step, slurmstepd, the wrapper, python,
  torch and isoprobe's child imported), or 0 where the ranks were warm before;
- of which **launch** (requests -> the first rank's task.json) and **import** (the last task.json -> the last
  ``warm``), where they happened after the requests;
- **run**: ranks warm (or requests written, if later) -> the first ``result`` (build, the steps, the verdict;
  ``steps``: the optimizer steps the slowest rank reported);
- **end**: the first ``result`` -> srun gone (the gang's other ranks stopped, the step ended);
- **next**: srun gone -> the next trial's requests, or isoprobe's exit (the step leaving ``squeue -s``, the
  trial's classification, the search's next batch);
- **ahead**: for a step started ahead, the seconds of its launch and imports done before its trial was due
  (off the trial's path).

It imports nothing of isoprobe, and reads only files and /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STEP = re.compile(r"^trial(\d+)-b(\d+)(?:-again\d+)?\.step$")


class Watcher(threading.Thread):
    """First-seen times of the step folders, the ranks' files and srun's process; the ranks' events as they grow."""

    def __init__(self, root: Path):
        super().__init__(daemon=True)
        self.root = root
        self.seen: dict[str, float] = {}
        self.events: dict[str, list[dict]] = {}
        self.trials: dict[str, dict] = {}  # step folder -> its trial.json (name, batch)
        self.srun_alive: dict[str, float] = {}  # step folder -> last time srun was seen running for it
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.look()
            time.sleep(0.005)
        self.look()

    def look(self) -> None:
        now = time.time()
        for step in self.root.glob("isoprobe-*/*.step"):
            self.seen.setdefault(str(step), now)
            trial = step / "trial.json"
            if str(trial) not in self.seen and trial.exists():
                try:
                    self.trials[str(step)] = json.loads(trial.read_text())
                    self.seen[str(trial)] = now
                except ValueError:
                    pass
            for path in step.glob("rank*"):
                if path.name.endswith((".task.json", ".exit")):
                    self.seen.setdefault(str(path), now)
                elif path.name.endswith(".events.jsonl"):
                    try:
                        lines = path.read_text().splitlines()
                    except OSError:
                        continue
                    parsed = []
                    for line in lines:
                        try:
                            parsed.append(json.loads(line))
                        except ValueError:
                            break
                    if len(parsed) >= len(self.events.get(str(path), [])):
                        self.events[str(path)] = parsed
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                command = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if command and command[0].endswith(b"srun") and b"--job-name=isoprobe-trial" in command:
                for word in command:
                    if word.endswith(b".step") and b"--" not in word[:2]:
                        self.srun_alive[word.decode()] = now


def phases(watcher: Watcher, ended: float) -> tuple[list[dict], int]:
    """One row per trial, in the order the trials were due; and the number of steps started ahead and never used."""
    steps = []
    for path, made in watcher.seen.items():
        if not path.endswith(".step"):
            continue
        named = STEP.match(Path(path).name)
        if path in watcher.trials:
            due = watcher.seen[path + "/trial.json"]
            trial = watcher.trials[path]
            index, batch = int(re.sub(r"\D", "", trial["trial"].split("-")[0]) or 0), trial["batch_size"]
        elif named:  # requests written before srun: due when the folder was made
            due, index, batch = made, int(named.group(1)), int(named.group(2))
        else:
            continue  # started ahead, never used
        steps.append((due, made, path, index, batch))
    steps.sort()
    unused = sum(1 for path in watcher.seen if path.endswith(".step")) - len(steps)
    rows = []
    for position, (due, made, step, index, batch) in enumerate(steps):
        following = steps[position + 1][0] if position + 1 < len(steps) else ended
        tasks = [t for path, t in watcher.seen.items() if path.startswith(step + "/") and path.endswith("task.json")]
        warm, result, counts = [], [], []
        for path, events in watcher.events.items():
            if path.startswith(step + "/"):
                warm += [e["t"] for e in events if e.get("event") == "warm"][:1]
                result += [e["t"] for e in events if e.get("event") == "result"]
                counts.append(sum(1 for e in events if e.get("event") == "step"))
        ready = max(warm) if warm and tasks and len(warm) == len(tasks) else None
        gone = watcher.srun_alive.get(step)
        row = {"trial": index, "batch": batch, "step_folder": Path(step).name, "ranks": len(tasks),
               "steps": min(counts, default=0)}
        row["wait"] = round(max(0.0, ready - due), 2) if ready else None
        row["launch"] = round(max(0.0, min(tasks) - due), 2) if tasks else None
        row["import"] = round(max(0.0, ready - max(due, max(tasks))), 2) if ready else None
        row["run"] = round(min(result) - max(due, ready), 2) if result and ready else None
        row["end"] = round(gone - min(result), 2) if gone and result else None
        row["next"] = round(following - gone, 2) if gone else None
        row["ahead"] = round(min(ready, due) - made, 2) if ready and made < due - 0.01 else 0.0
        row["total"] = round(following - due, 2)
        rows.append(row)
    return rows, unused


PHASES = ("wait", "launch", "import", "run", "end", "next", "ahead")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="passed on to isoprobe run (e.g. distributed.steps_ahead=true)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="step-time-", dir=os.environ.get("STEP_TIME_DIR")) as folder:
        watcher = Watcher(Path(folder))
        watcher.start()
        began = time.time()
        overrides = [word for pair in options.set for word in ("--set", pair)]
        done = subprocess.run([sys.executable, "-m", "isoprobe", "run", str(options.spec), "--no-cache",
                               "--format", "json", *overrides], env={**os.environ, "TMPDIR": folder}, capture_output=True,
                              text=True)
        ended = time.time()
        watcher.stop.set()
        watcher.join()
    rows, unused = phases(watcher, ended)
    first = min((t for p, t in watcher.seen.items() if p.endswith(".step")), default=ended)
    summary = {"returncode": done.returncode, "wall_s": round(ended - began, 2),
               "before_first_step_s": round(first - began, 2), "unused_ahead_steps": unused, "trials": rows}
    for phase in PHASES:
        summary[f"{phase}_s"] = round(sum(r[phase] or 0 for r in rows), 2)
    if options.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"isoprobe exit {done.returncode}, {summary['wall_s']} s, of which {summary['before_first_step_s']} s before "
          "the first step (start-up, environment check)")
    print(f"{'trial':>5} {'batch':>5} {'ranks':>5} {'steps':>5} " + " ".join(f"{k:>7}" for k in (*PHASES, "total")))
    for r in rows:
        cells = [r[k] if r[k] is not None else "-" for k in (*PHASES, "total")]
        print(f"{r['trial']!s:>5} {r['batch']!s:>5} {r['ranks']:>5} {r['steps']:>5} "
              + " ".join(f"{c!s:>7}" for c in cells))
    print("sum: " + ", ".join(f"{phase} {summary[phase + '_s']} s" for phase in PHASES)
          + f"; steps started ahead and not used: {unused}")
    if done.returncode not in (0, 3):
        print(done.stderr[-2000:], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
