"""The five held-out training scripts: isoprobe's answer, and the user's own job at it and one above, as a hook leaves it.

    OMP_NUM_THREADS=1 python benchmarks/studies/hook_truth_table.py [--before PATH] [--json FILE]

For each script of tests/integration/test_command.py's FIVE (the command, its per-process budget, where the search
starts): ``isoprobe run -- COMMAND`` (no cache, no soak), then the script itself in fresh processes with
``RLIMIT_DATA`` = the budget on every process and exactly what ``isoprobe show --format env`` exported
(``benchmarks/harness/command_truth.py``), 30 steps at the maximum and at the maximum plus one. ``--before PATH``: also the
answer of the isoprobe at PATH (a worktree of an earlier commit, run through ``PYTHONPATH``), side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks" / "harness"), str(ROOT / "tests"), str(ROOT / "tests" / "support"),
                 str(ROOT / "tests" / "integration")]

import command_truth  # noqa: E402
from test_command import FIVE, LONG_RUN, exported_environment  # noqa: E402


def probe(command: list[str], budget: str, start: int, pythonpath: str | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    run = subprocess.run([sys.executable, "-m", "isoprobe", "run", "--no-cache", "--format", "json", "--memory-budget",
                          budget, "--set", f"search.start_batch_size={start}", "--set", "recommendation.soak_steps=0",
                          "--", *command], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    return json.loads(run.stdout) if run.stdout.strip() else {"message": run.stderr[-500:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a worktree of an earlier isoprobe, run through PYTHONPATH")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for name, template, budget, start in FIVE:
        command = [LONG_RUN if word == "{max_steps}" else word for word in template]
        now = probe(command, budget, start, None)
        before = probe(command, budget, start, args.before) if args.before else None
        with tempfile.TemporaryDirectory() as folder:
            saved = Path(folder) / "result.json"
            saved.write_text(json.dumps(now))
            shown = subprocess.run([sys.executable, "-m", "isoprobe", "show", str(saved), "--format", "env"],
                                   capture_output=True, text=True, cwd=ROOT)
            exported = exported_environment(shown.stdout)
            cap = command_truth.parse_size(budget)
            at = command_truth.run_once(template, now["max_batch_size"], 30, cap, 600, Path(folder), exported=exported)
            above = command_truth.run_once(template, now["max_batch_size"] + 1, 30, cap, 600, Path(folder),
                                           exported=exported)
        row = {"script": name, "budget": budget, "before": before and before.get("max_batch_size"),
               "before_trials": before and len(before.get("trials", [])), "now": now["max_batch_size"],
               "first_failing": now["first_failing_batch_size"], "trials": len(now["trials"]),
               "seconds": now["total_seconds"], "job_at_answer": at.outcome, "job_above": above.outcome,
               "exported": {k: v for k, v in exported.items() if not k.startswith("ISOPROBE_")}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| script | budget | before (trials) | now (trials) | job at now, 30 steps | job at now + 1 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        before = f"{r['before']} ({r['before_trials']})" if r["before"] is not None else "-"
        print(f"| {r['script']} | {r['budget']} | {before} | {r['now']} ({r['trials']}) | {r['job_at_answer']} | "
              f"{r['job_above']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
