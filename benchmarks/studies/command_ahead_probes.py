"""Command probes with each trial's command started ahead and without, side by side (issue 49, part 3).

For each case of ``fewest_trials.py`` whose command an interpreter can be started ahead for (``python SCRIPT``: the
plain loop, the LightningCLI script, the Hugging Face Trainer script; the torchrun and ``accelerate launch``
commands start cold either way), ``isoprobe run`` with ``search.warm_start=true`` (the default: the command
started ahead) and ``false`` (started when its trial is due), alternating which goes first, ``--rounds`` times.
Per probe: the answer and the first failing batch, the trials, the wall and CPU seconds of the whole probe (the
children's, from ``getrusage``), the sum over trials of ``first_step_seconds`` (what a trial paid before its first
reading) and of the trials' own seconds, and the peak of the trial that decided the maximum. The median of each
over the rounds is printed as a table.

    python benchmarks/studies/command_ahead_probes.py --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fewest_trials import CASES  # noqa: E402  (the same commands and budgets)

REPO = Path(__file__).resolve().parents[2]
PYTHON_CASES = [case for case in CASES if case[0].startswith(("plain_loop", "lightning_cli", "hf_trainer"))]
MODES = ("ahead", "cold")


def probe(arguments: list[str], mode: str) -> dict:
    setting = ["--set", f"search.warm_start={'true' if mode == 'ahead' else 'false'}",
               "--set", "search.command_ahead=true"]
    with tempfile.TemporaryDirectory(prefix="isoprobe-ahead-") as scratch:
        env = {**os.environ, "TMPDIR": scratch, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "isoprobe", "run", "--no-cache", "--format", "json", *setting,
                               *arguments], capture_output=True, text=True, env=env, cwd=REPO)
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(done.stdout) if done.stdout.strip() else {}
    trials = result.get("trials", [])
    deciding = [t for t in trials if t["outcome"] == "fits" and t["batch_size"] == result.get("max_batch_size")]
    return {"mode": mode, "returncode": done.returncode, "answer": result.get("max_batch_size"),
            "first_failing": result.get("first_failing_batch_size"), "trials": len(trials),
            "started_ahead": [t.get("started_ahead") for t in trials],
            "first_step_s": round(sum(t.get("first_step_seconds") or 0 for t in trials), 2),
            "trial_s": round(sum(t["seconds"] for t in trials), 2),
            "deciding_peak_mib": [round(t["budget_peak_bytes"] / (1 << 20), 2) for t in deciding
                                  if t.get("budget_peak_bytes")],
            "timed_out": sum(t["outcome"] == "timed_out" for t in trials),
            "busy_s": round(sum(t.get("busy_seconds") or 0 for t in trials), 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "wall_s": round(wall, 1), "stderr_tail": done.stderr[-600:] if done.returncode else ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="probes of each mode per case (alternating)")
    parser.add_argument("--only", nargs="*", help="case names containing any of these words (default: all three)")
    parser.add_argument("--json", type=Path, help="write every probe's numbers here")
    args = parser.parse_args(argv)
    cases = [c for c in PYTHON_CASES if not args.only or any(word in c[0] for word in args.only)]
    runs: list[dict] = []
    for name, arguments in cases:
        for round_ in range(args.rounds):
            for mode in (MODES if round_ % 2 == 0 else tuple(reversed(MODES))):
                run = probe(arguments, mode) | {"case": name}
                runs.append(run)
                print(f"{name} [{mode}] #{round_ + 1}: {run['answer']} / {run['first_failing']}, {run['trials']} "
                      f"trials, {run['wall_s']} s wall, {run['cpu_s']} CPU s, first steps {run['first_step_s']} s, "
                      f"deciding peak {run['deciding_peak_mib']} MiB, ahead {run['started_ahead']}",
                      file=sys.stderr, flush=True)
                if args.json:
                    args.json.write_text(json.dumps(runs, indent=1))
    print("| case | mode | probes | answers / first failing | trials | median wall s | median CPU s | "
          "median sum of first_step_seconds | median sum of trial seconds | deciding trial's peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, _ in cases:
        for mode in MODES:
            mine = [r for r in runs if r["case"] == name and r["mode"] == mode]
            answers = sorted({f"{r['answer']} / {r['first_failing']}" for r in mine})
            peaks = sorted(p for r in mine for p in r["deciding_peak_mib"])
            print(f"| {name} | {mode} | {len(mine)} | {', '.join(answers)} | "
                  f"{', '.join(str(r['trials']) for r in mine)} | {statistics.median(r['wall_s'] for r in mine)} | "
                  f"{statistics.median(r['cpu_s'] for r in mine)} | "
                  f"{statistics.median(r['first_step_s'] for r in mine)} | "
                  f"{statistics.median(r['trial_s'] for r in mine)} | "
                  f"{peaks[0] if peaks else '-'}..{peaks[-1] if peaks else '-'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
