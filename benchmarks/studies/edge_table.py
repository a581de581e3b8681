"""The table behind issue 25's class 6: each spec's plain-process edge against isoprobe's maximum.

    python benchmarks/studies/edge_table.py SPEC.yaml... [--isoprobe CHECKOUT]...

For each spec: the edge ``plain_edge.py`` bisects in fresh plain processes,
and the ``max_batch_size`` of ``python -m isoprobe run SPEC --no-cache`` run
from each CHECKOUT (a folder holding the isoprobe package; default: this one),
with a fresh cache folder each. Prints a Markdown table; '+n' in a cell is
how far the maximum is above the plain edge (a 'fits' a plain process cannot
have), '-n' how far below (memory wasted).

Run it with ``OMP_NUM_THREADS=1`` for edges that repeat: both sides inherit
it, and with two threads the plain process's own edge moved by a sample from
run to run on a 2-core machine (its threads' allocations interleave).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from plain_edge import edge  # noqa: E402

from isoprobe.spec.load import load_spec  # noqa: E402

HERE = Path(__file__).resolve().parents[2]


def isoprobe_maximum(spec_path: str, checkout: Path) -> int | None:
    with tempfile.TemporaryDirectory(prefix="edge-table-") as cache:
        env = {**os.environ, "ISOPROBE_CACHE_DIR": cache, "PYTHONPATH": str(checkout)}
        run = subprocess.run([sys.executable, "-m", "isoprobe", "run", str(Path(spec_path).resolve()), "--no-cache"],
                             cwd=checkout, env=env, capture_output=True, text=True)
    if run.returncode not in (0, 3):
        sys.stderr.write(run.stderr[-3000:])
        return None
    return json.loads(run.stdout)["max_batch_size"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--isoprobe", action="append", type=Path, default=None, help="a checkout to run isoprobe from")
    args = parser.parse_args()
    checkouts = args.isoprobe or [HERE]
    print("| spec | plain edge | " + " | ".join(f"isoprobe ({c})" for c in checkouts) + " |")
    print("|---|---|" + "---|" * len(checkouts))
    for spec_path in args.specs:
        spec = load_spec(spec_path)
        plain = edge(spec, spec.memory_budget, start=8)
        cells = []
        for checkout in checkouts:
            maximum = isoprobe_maximum(spec_path, checkout)
            cells.append("failed" if maximum is None else f"{maximum} ({maximum - plain:+d})")
        print(f"| {Path(spec_path).stem} | {plain} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
