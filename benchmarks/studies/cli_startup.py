"""Start-up time of the commands that run nothing: ``--help``, ``validate``, ``schema``, and a cache hit.

Each command is run N times as a fresh subprocess (as a user runs it) and its
wall time measured; the table shows median, min and max seconds, the median as
a fraction of the 0.3 s target, and the median CPU time (user + system) of the
process, which other load on the machine disturbs less than wall time.
The cache hit is a pre-job hook's whole run: ``isoprobe run --format env`` on a spec
whose answer is cached (a small probe of specs/small-cnn.yaml, capped at batch 2,
primes a temporary cache first; it is not timed). ``python -c pass`` is the interpreter's own floor (site-packages, the
editable-install finder): no change to isoprobe can go below it.

Run from the repository root, with the virtual environment active::

    python benchmarks/studies/cli_startup.py            # 10 runs of each, the installed ``isoprobe``
    python benchmarks/studies/cli_startup.py -n 30
    python benchmarks/studies/cli_startup.py --module   # ``python -m isoprobe`` from this checkout

Not a test: timings depend on the machine and its load. One run of each
command before the measured ones warms the file cache and is not counted.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET_SECONDS = 0.3


def _isoprobe(module: bool) -> list[str]:
    """The installed console script next to this interpreter (else on PATH), or ``python -m isoprobe``."""
    script = Path(sys.executable).parent / "isoprobe"
    found = str(script) if script.exists() else shutil.which("isoprobe")
    return [found] if found and not module else [sys.executable, "-m", "isoprobe"]


def commands(module: bool = False) -> dict[str, list[str]]:
    isoprobe = _isoprobe(module)
    return {
        "isoprobe --help": isoprobe + ["--help"],
        "isoprobe validate specs/resnet50.yaml": isoprobe + ["validate", "specs/resnet50.yaml"],
        "isoprobe schema": isoprobe + ["schema"],
        "isoprobe schema --spec": isoprobe + ["schema", "--spec"],
        "isoprobe run (cache hit) --format env": isoprobe + CACHED_RUN,
        "python -c pass": [sys.executable, "-c", "pass"],
    }


CACHED_RUN = ["run", "specs/small-cnn.yaml", "--max-batch-size", "2", "--format", "env"]


def prime_cache(module: bool) -> None:
    """One real (small) probe, so that the timed runs of CACHED_RUN are hits."""
    done = subprocess.run(_isoprobe(module) + CACHED_RUN, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0 or "ISOPROBE_CACHE_HIT=0" not in done.stdout:
        raise SystemExit(f"priming the cache failed:\n{done.stderr}")


def time_once(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr.decode(errors='replace')}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=10, help="runs per command (default 10)")
    parser.add_argument(
        "--module", action="store_true", help="run 'python -m isoprobe' in this checkout, not the installed script"
    )
    args = parser.parse_args(argv)
    cache = tempfile.TemporaryDirectory(prefix="isoprobe-bench-cache-")
    os.environ["ISOPROBE_CACHE_DIR"] = cache.name
    prime_cache(args.module)
    print(f"{'command':<40} {'median':>7} {'min':>7} {'max':>7}  {'median/0.3s':>11}  {'cpu':>6}")
    for label, command in commands(args.module).items():
        time_once(command)  # warm-up: file cache, not counted
        runs = [time_once(command) for _ in range(args.runs)]
        walls = [wall for wall, _ in runs]
        median = statistics.median(walls)
        cpu = statistics.median(cpu for _, cpu in runs)
        print(
            f"{label:<40} {median:7.3f} {min(walls):7.3f} {max(walls):7.3f}  {median / TARGET_SECONDS:10.2f}x"
            f"  {cpu:6.3f}"
        )
    print(f"({args.runs} runs each; seconds of wall time, cpu = median user + system; target {TARGET_SECONDS} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
