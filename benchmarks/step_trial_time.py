"""Where a gang trial's time goes when it runs as a Slurm job step, per phase, seen from outside isoprobe.

    # inside an allocation (sbatch -N2 --ntasks-per-node=1 ...), with this checkout on PYTHONPATH:
    python benchmarks/step_trial_time.py SPEC [--json]

Runs ``isoprobe run SPEC --no-cache`` (the spec's ``distributed.launcher`` srun, or auto in a job of
several nodes) with a fresh TMPDIR of its own, and watches that folder every 5 ms from this process: each
trial's step folder (``trialNNN-bB.step``: isoprobe writes the ranks' requests there, then starts srun), each
rank's ``task.json`` (srun_rank writes it first thing, before the child imports anything), the ranks' events
(every event carries its wall-clock time: ``warm`` when the child's imports are done, ``result`` its verdict)
and srun's own process (found in /proc by the step's folder on its command line). Per trial:

- **launch**: step folder made -> the first rank's task.json (srun, slurmctld's step, slurmstepd, the wrapper);
- **import**: the last rank's task.json -> the last rank's ``warm`` (python, torch, isoprobe's child, cold);
- **run**: the last ``warm`` -> the first ``result`` (build the model, the steps, the verdict);
- **end**: the first ``result`` -> srun gone (the gang's other ranks stopped, the step ended);
- **next**: srun gone -> the next step folder, or isoprobe's exit (the step leaving ``squeue -s``,
  the trial's classification, the search's next batch, the next requests written).

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


def phases(watcher: Watcher, ended: float) -> list[dict]:
    steps = sorted((t, path) for path, t in watcher.seen.items() if path.endswith(".step"))
    rows = []
    for index, (made, step) in enumerate(steps):
        following = steps[index + 1][0] if index + 1 < len(steps) else ended
        tasks = [t for path, t in watcher.seen.items() if path.startswith(step + "/") and path.endswith("task.json")]
        warm, result = [], []
        for path, events in watcher.events.items():
            if path.startswith(step + "/"):
                warm += [e["t"] for e in events if e.get("event") == "warm"]
                result += [e["t"] for e in events if e.get("event") == "result"]
        gone = watcher.srun_alive.get(step)
        match = STEP.match(Path(step).name)
        row = {"trial": int(match.group(1)) if match else None, "batch": int(match.group(2)) if match else None,
               "step_folder": Path(step).name, "ranks": len(tasks)}
        row["launch"] = round(min(tasks) - made, 2) if tasks else None
        row["import"] = round(max(warm) - max(tasks), 2) if warm and tasks and len(warm) == len(tasks) else None
        row["run"] = round(min(result) - max(warm), 2) if result and warm else None
        row["end"] = round(gone - min(result), 2) if gone and result else None
        row["next"] = round(following - gone, 2) if gone else None
        row["total"] = round(following - made, 2)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", type=Path)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="step-time-", dir=os.environ.get("STEP_TIME_DIR")) as folder:
        watcher = Watcher(Path(folder))
        watcher.start()
        began = time.time()
        done = subprocess.run([sys.executable, "-m", "isoprobe", "run", str(options.spec), "--no-cache",
                               "--format", "json"], env={**os.environ, "TMPDIR": folder}, capture_output=True,
                              text=True)
        ended = time.time()
        watcher.stop.set()
        watcher.join()
    rows = phases(watcher, ended)
    first = min((t for p, t in watcher.seen.items() if p.endswith(".step")), default=ended)
    summary = {"returncode": done.returncode, "wall_s": round(ended - began, 2),
               "before_first_step_s": round(first - began, 2), "trials": rows}
    for phase in ("launch", "import", "run", "end", "next"):
        summary[f"{phase}_s"] = round(sum(r[phase] or 0 for r in rows), 2)
    if options.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"isoprobe exit {done.returncode}, {summary['wall_s']} s, of which {summary['before_first_step_s']} s before "
          "the first step (start-up, environment check)")
    print(f"{'trial':>5} {'batch':>5} {'ranks':>5} {'launch':>7} {'import':>7} {'run':>7} {'end':>7} {'next':>7} "
          f"{'total':>7}")
    for r in rows:
        cells = [r[k] if r[k] is not None else "-" for k in ("launch", "import", "run", "end", "next", "total")]
        print(f"{r['trial']!s:>5} {r['batch']!s:>5} {r['ranks']:>5} " + " ".join(f"{c!s:>7}" for c in cells))
    print("sum: " + ", ".join(f"{phase} {summary[phase + '_s']} s" for phase in ("launch", "import", "run", "end",
                                                                              "next")))
    if done.returncode not in (0, 3):
        print(done.stderr[-2000:], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
