"""A frontier against probing each of its points alone: the maxima, the trials and the wall time, side by side.

    python benchmarks/studies/frontier_vs_single.py SPEC.yaml --over input.shape.0=16,32,64,128 [--set FIELD=VALUE ...]

Runs ``isoprobe frontier SPEC --over ...`` in a fresh cache, then ``isoprobe run
SPEC --set FIELD=VALUE`` for each value, each in a fresh cache of its own (so
nothing is borrowed and nothing is cached), then the frontier again in its own
cache (every point a cache hit). Prints one row per value: the maximum each way,
the trials each way (a point's own trials; recommendation checks and soaks
included), the seconds each way (a point's seconds include its environment
check), and the totals. Not a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def isoprobe(args: list[str], cache: str) -> tuple[dict, float]:
    env = {**os.environ, "ISOPROBE_CACHE_DIR": cache}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "isoprobe", *args], capture_output=True, text=True, env=env)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"isoprobe {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--over", required=True)
    parser.add_argument("--set", action="append", default=[], dest="set")
    args = parser.parse_args()
    sets = [a for text in args.set for a in ("--set", text)]
    field = args.over.partition("=")[0]
    with tempfile.TemporaryDirectory(prefix="isoprobe-frontier-bench-") as folder:
        frontier, frontier_seconds = isoprobe(["frontier", args.spec, "--over", args.over, *sets],
                                              os.path.join(folder, "frontier"))
        rows, alone_trials, alone_seconds = [], 0, 0.0
        for point in frontier["points"]:
            value = json.dumps(point["value"])
            alone, seconds = isoprobe(["run", args.spec, *sets, "--set", f"{field}={value}"],
                                      os.path.join(folder, f"alone-{value}"))
            alone_trials += len(alone["trials"])
            alone_seconds += seconds
            rows.append((value, point["max_batch_size"], alone["max_batch_size"], point["tokens_per_batch"],
                         point["trials"], len(alone["trials"]), point["seconds"], seconds))
        again, again_seconds = isoprobe(["frontier", args.spec, "--over", args.over, *sets],
                                        os.path.join(folder, "frontier"))
    print(f"{field:>14} {'max':>6} {'alone':>6} {'tokens':>8} {'trials':>7} {'alone':>6} {'seconds':>8} {'alone':>7}")
    for value, maximum, alone_max, tokens, trials, alone_count, seconds, alone_s in rows:
        print(f"{value:>14} {maximum!s:>6} {alone_max!s:>6} {tokens!s:>8} {trials:>7} {alone_count:>6} "
              f"{seconds:8.1f} {alone_s:7.1f}")
    print(f"{'total':>14} {'':>6} {'':>6} {'':>8} {frontier['total_trials']:>7} {alone_trials:>6} "
          f"{frontier_seconds:8.1f} {alone_seconds:7.1f}")
    print(f"trials frontier/alone {frontier['total_trials'] / alone_trials:.2f}; "
          f"seconds frontier/alone {frontier_seconds / alone_seconds:.2f}; "
          f"rerun from the cache: {again['total_trials']} trials in {again_seconds:.1f} s")
    same = all(row[1] == row[2] for row in rows)
    print("every point's maximum equals the probe alone" if same else "MAXIMA DIFFER: see the rows")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
