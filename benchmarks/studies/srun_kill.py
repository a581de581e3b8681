"""What is left, and for how long, when isoprobe is SIGKILLed while a trial runs as a Slurm job step.

    python benchmarks/studies/srun_kill.py [KILL|TERM|INT]   # inside an allocation of 2 tasks (sbatch --ntasks=2)

Starts ``isoprobe run`` on a DDP gang of two ranks (``distributed.launcher:
srun``) whose ranks both hang at batch 2 (tests/support/faults.py), waits until both
ranks are inside the fault, sends isoprobe the signal (SIGKILL by default:
nothing of isoprobe's own code runs after that; TERM and INT: its own
interrupt path, exit 143 / 130 with the trials so far), then looks every 10 ms at what is still there: srun, the
ranks (processes carrying this run's marker in their environment, found in
/proc whatever their parent), and the step in ``squeue -s``. Prints the seconds
until each is gone. Needs the Slurm clients and a tree where ``python -m
isoprobe`` is this checkout (PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAULTS = REPO / "tests" / "support" / "faults.py"


def marked(value: str) -> list[int]:
    """Live processes whose environment has ISOPROBE_BENCH_MARKER=value."""
    needle = f"ISOPROBE_BENCH_MARKER={value}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if needle not in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                continue
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(int(name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def steps(job: str) -> list[str]:
    listed = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True).stdout
    return [step for step in listed.split() if not step.endswith(".batch")]


def main() -> int:
    signum = getattr(signal, f"SIG{(sys.argv[1:] or ['KILL'])[0].upper()}")
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        sys.exit("run this inside a Slurm allocation of 2 tasks (sbatch --ntasks=2 / salloc -n2)")
    folder = Path(tempfile.mkdtemp(prefix="srun-kill-"))
    state = folder / "state"
    state.mkdir()
    spec = {
        "model": {"factory": f"{FAULTS}:faulty",
                  "kwargs": {"fault": "hang", "at": 2, "ranks": [0, 1], "state_dir": str(state)}},
        "input": {"shape": [16]}, "target": {"classes": 4}, "optimizer": {"name": "sgd"},
        "search": {"start_batch_size": 2, "steps": 2, "trial_timeout": 300, "estimate": False},
        "device": "cpu", "memory_budget": "1.5GiB",
        "distributed": {"strategy": "ddp", "world_size": 2, "launcher": "srun"},
    }
    (folder / "spec.yaml").write_text(json.dumps(spec))
    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "ISOPROBE_BENCH_MARKER": marker, "PYTHONPATH": str(REPO)}
    isoprobe = subprocess.Popen([sys.executable, "-m", "isoprobe", "run", str(folder / "spec.yaml"), "--no-cache"],
                                env=env, stdout=subprocess.DEVNULL, stderr=open(folder / "isoprobe.stderr", "wb"))
    deadline = time.monotonic() + 300
    while len(list(state.glob("committed-*"))) < 2:
        if time.monotonic() > deadline or isoprobe.poll() is not None:
            print((folder / "isoprobe.stderr").read_text())
            return 1
        time.sleep(0.05)
    before = {"processes": len(marked(marker)), "steps": steps(job)}
    srun = [pid for pid in marked(marker)
            if Path(f"/proc/{pid}/comm").read_text().strip() == "srun"]
    isoprobe.send_signal(signum)
    killed = time.monotonic()
    code = isoprobe.wait()
    exited = time.monotonic() - killed
    gone: dict[str, float | None] = {"srun": None, "ranks and every marked process": None, "step in squeue -s": None}
    while time.monotonic() - killed < 60 and None in gone.values():
        now = time.monotonic() - killed
        if gone["srun"] is None and not any(alive(pid) for pid in srun):
            gone["srun"] = now
        if gone["ranks and every marked process"] is None and not marked(marker):
            gone["ranks and every marked process"] = now
        if gone["step in squeue -s"] is None and not steps(job):
            gone["step in squeue -s"] = now
        time.sleep(0.01)
    print(f"{signum.name}: isoprobe exited {code}, {exited:.3f} s after the signal")
    print(f"before the signal: {before['processes']} marked processes (isoprobe, keeper, srun, rank wrappers, ranks), "
          f"steps {before['steps']}")
    for what, seconds in gone.items():
        print(f"  {what:32} gone {seconds:.3f} s after the signal" if seconds is not None
              else f"  {what:32} STILL THERE after 60 s")
    print(f"left alive now: {len(marked(marker))} processes, steps {steps(job)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
