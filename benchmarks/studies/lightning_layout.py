"""The Lightning script's own runs at one batch, without isoprobe's parent: does its need depend on the run?

Each run is ``tests/commands/lightning_cli.py fit`` at BATCH for STEPS steps under a cap of CAP MiB
(``run_once`` of ``benchmarks/harness/command_truth.py``: a fresh session, ``RLIMIT_DATA`` on every process, the malloc threshold,
one thread), while a thread of this process samples the script's data segment (``/proc/PID/statm``) every
millisecond. Prints each run's outcome, its sampled peak and the peak in each second of the run: a hold shows
as a second or two some MiB above the steps around it.

    python benchmarks/studies/lightning_layout.py 38 5 14 2048             # ASLR on: some runs hold one input batch
    NOASLR=1 PYTHONHASHSEED=0 python benchmarks/studies/lightning_layout.py 38 5 14 2048   # setarch -R: alike
    python benchmarks/studies/lightning_layout.py 38 7 30 1085             # under the cap: how many train 30 steps
    SHIM=1 python benchmarks/studies/lightning_layout.py 38 6 30 1085      # the same with isoprobe's shim loaded

docs/results/command-truth.md has what it measured.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
import command_truth  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = [sys.executable, str(REPO / "tests/commands/lightning_cli.py"), "fit", "--data.batch_size", "{batch_size}",
            "--trainer.max_steps", "{max_steps}"]


def main() -> None:
    batch, runs, steps, cap_mib = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    survived = 0
    for index in range(runs):
        work = Path(tempfile.mkdtemp(prefix="lightning-layout-"))
        if os.environ.get("SHIM"):
            shim = work / "shim"
            shim.mkdir()
            (shim / "gate").write_text("1000000")  # never waits: the script steps as it would alone
            os.environ["PYTHONPATH"] = str(REPO / "isoprobe/child/shim")
            os.environ["ISOPROBE_SHIM_DIR"] = str(shim)
        samples: list[tuple[float, int]] = []
        stop = threading.Event()

        def sample() -> None:
            pids: set[str] = set()
            while not stop.is_set():
                for name in os.listdir("/proc"):
                    if name.isdigit() and name not in pids:
                        try:
                            if b"lightning_cli.py" in open(f"/proc/{name}/cmdline", "rb").read():
                                pids.add(name)
                        except OSError:
                            pass
                for pid in list(pids):
                    try:
                        samples.append((time.time(), int(open(f"/proc/{pid}/statm").read().split()[5]) * 4096))
                    except (OSError, IndexError, ValueError):
                        pids.discard(pid)
                time.sleep(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        command = (["setarch", "x86_64", "-R"] if os.environ.get("NOASLR") else []) + TEMPLATE
        run = command_truth.run_once(command, batch, steps, int(cap_mib * 2**20), 300, work)
        stop.set()
        sampler.join()
        survived += run.outcome == "survived"
        start = samples[0][0] if samples else 0.0
        seconds = int(samples[-1][0] - start) + 1 if samples else 0
        per_second = [round(max([v for t, v in samples if k <= t - start < k + 1] or [0]) / 2**20, 2)
                      for k in range(seconds)]
        top = max((v for _, v in samples), default=0) / 2**20
        print(f"{index} batch {batch}: {run.outcome} ({(run.reason or '')[:60]}), sampled peak {top:.2f} MiB, "
              f"per second {per_second}", flush=True)
    print(f"{survived} of {runs} trained {steps} steps at {batch} under {cap_mib:g} MiB")


if __name__ == "__main__":
    main()
