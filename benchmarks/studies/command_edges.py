"""isoprobe on the five real training scripts of tests/commands, beside the scripts' own edges (issue 36).

For each script: ``isoprobe run -- COMMAND`` (CPU backend, one thread, no cache, no soak) under the budget its
truth was measured at, then a scan of every process for anything of its trials left behind. The scripts' own
edges come from ``benchmarks/harness/command_truth.py`` runs without isoprobe (docs/results/command-truth/*.json), read
here, not recomputed. Prints one markdown table; ``--json FILE`` keeps every number.

    python benchmarks/studies/command_edges.py --json docs/results/command-edges.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMMANDS = REPO / "tests" / "commands"
TRUTH = REPO / "docs" / "results" / "command-truth"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
ACCELERATE = str(Path(sys.executable).parent / "accelerate")

#: (name, truth file stem, budget, search start, the command as a job runs it, without a step limit of its own).
CASES = [
    ("plain argparse + DataLoader(2 workers)", "plain_loop", "1GiB", 32,
     [sys.executable, str(COMMANDS / "plain_loop.py"), "--batch-size", "{batch_size}", "--max-steps", "100000"]),
    ("torchrun DDP, 2 ranks", "ddp_train", "894MiB", 8,
     [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(COMMANDS / "ddp_train.py"), "--batch-size",
      "{batch_size}", "--max-steps", "100000"]),
    # The same script 1 MiB higher: under 894 MiB its own 14 trains with about 2 MiB to spare, a MiB of which moves
    # between fresh processes, so one trial cannot tell it from none (docs/measurements.md); here it has one more.
    ("torchrun DDP, 2 ranks, 1 MiB more", "ddp_train-895MiB", "895MiB", 8,
     [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(COMMANDS / "ddp_train.py"), "--batch-size",
      "{batch_size}", "--max-steps", "100000"]),
    ("LightningCLI fit", "lightning_cli", "1085MiB", 24,
     [sys.executable, str(COMMANDS / "lightning_cli.py"), "fit", "--data.batch_size", "{batch_size}",
      "--trainer.max_steps", "100000"]),
    ("HF Trainer (HfArgumentParser)", "hf_trainer_script", "1152MiB", 8,
     [sys.executable, str(COMMANDS / "hf_trainer_script.py"), "--per_device_train_batch_size", "{batch_size}",
      "--max_steps", "100000", "--output_dir", "/tmp/isoprobe-bench-hf-out", "--report_to", "none",
      "--save_strategy", "no", "--use_cpu", "--disable_tqdm", "true"]),
    ("accelerate launch", "accelerate_script", "1GiB", 8,
     [ACCELERATE, "launch", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
      "--dynamo_backend", "no", "--cpu", str(COMMANDS / "accelerate_script.py"), "--batch-size", "{batch_size}",
      "--max-steps", "100000"]),
    # The same script 4 MiB higher: under 1 GiB its own 24 trains with 0.19 MiB to spare, less than the shim costs
    # in the process it measures (docs/command.md); here its own margin at 24 is 4.2 MiB.
    ("accelerate launch, 4 MiB more", "accelerate_script-1028MiB", "1028MiB", 8,
     [ACCELERATE, "launch", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
      "--dynamo_backend", "no", "--cpu", str(COMMANDS / "accelerate_script.py"), "--batch-size", "{batch_size}",
      "--max-steps", "100000"]),
]


def left_behind(marker: str) -> int:
    """Processes whose environment holds ``marker`` (the trials' TMPDIR): what the probe left running."""
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                if marker.encode() in handle.read():
                    count += 1
        except OSError:
            continue
    return count


def truth_of(stem: str) -> dict:
    path = TRUTH / f"{stem}.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {"budget": data.get("budget_bytes"), **{f"edge_{e['steps']}": e["edge"] for e in data.get("edges", [])},
            **{f"status_{e['steps']}": e["status"] for e in data.get("edges", [])}}


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / (1 << 20), 2)


def probe(command: list[str], budget: str, start: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="isoprobe-bench-") as scratch:
        env = {**os.environ, "TMPDIR": scratch, "OMP_NUM_THREADS": "1"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "isoprobe", "run", "--no-cache", "--format", "json",
                               "--memory-budget", budget, "--set", f"search.start_batch_size={start}",
                               "--set", "recommendation.soak_steps=0", *extra, "--", *command],
                              capture_output=True, text=True, env=env, cwd=REPO)
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        left = left_behind(scratch)
    result = json.loads(done.stdout) if done.stdout.strip() else {}
    margin = result.get("edge_margin") or {}
    marginal = [m["batch_size"] for m in margin.get("marginal", [])]
    answer = result.get("max_batch_size")
    fitting = [t for t in result.get("trials", []) if t["outcome"] == "fits"]
    churns = [t["heap_churn_bytes"] for t in fitting if t.get("heap_churn_bytes") is not None]
    capacity = margin.get("capacity_bytes")  # per rank: the budget each process of the command had
    at_answer = [t.get("budget_peak_bytes") for t in fitting if t["batch_size"] == answer and t.get("budget_peak_bytes")]
    return {"returncode": done.returncode, "answer": answer, "marginal": marginal,
            "marginal_free_mib": [_mib(m["free_bytes"]) for m in margin.get("marginal", [])],
            "fitting": [(t["batch_size"], t["purpose"], _mib(t.get("budget_peak_bytes")), _mib(t.get("heap_churn_bytes")))
                        for t in fitting],
            "floor_mib": _mib(margin.get("floor_bytes")), "spread_mib": _mib(margin.get("spread_bytes")),
            "heap_churn_mib": _mib(max(churns)) if churns else None,
            "free_at_answer_mib": _mib(capacity - max(at_answer)) if capacity and at_answer else None,
            "edge": max([b for b in [answer, *marginal] if b is not None], default=None),
            "first_failing": result.get("first_failing_batch_size"), "trials": len(result.get("trials", [])),
            "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "left": left, "message": result.get("message"), "stderr_tail": done.stderr[-1500:]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="case truth stems to run (default: all)")
    parser.add_argument("--json", help="write every number here")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="passed to isoprobe run, e.g. --set search.edge_spread=0 (the raw steady edge)")
    args = parser.parse_args(argv)
    rows = []
    for name, stem, budget, start, command in CASES:
        if args.only and stem not in args.only:
            continue
        truth = truth_of(stem)
        budget = budget or (f"{truth['budget'] // (1 << 20)}MiB" if truth.get("budget") else None)
        if budget is None:
            print(f"{name}: no measured truth (docs/results/command-truth/{stem}.json): skipped", file=sys.stderr)
            continue
        print(f"{name}: probing under {budget} ...", file=sys.stderr)
        extra = [word for text in args.set for word in ("--set", text)]
        rows.append({"name": name, "stem": stem, "budget": budget, "truth": truth,
                     **probe(command, budget, start, extra)})
    print("| script | budget | isoprobe answer | free at it, MiB | heap churn, MiB | floor, MiB | marginal (fit, inside the spread) | first failing | script's own edge, 5 steps | 30 steps | trials | wall s | CPU s | processes left |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        truth = row["truth"]
        print(f"| {row['name']} | {row['budget']} | {row['answer']} | {row['free_at_answer_mib']} | {row['heap_churn_mib']} "
              f"| {row['floor_mib']} | {row['marginal'] or '-'} | {row['first_failing']} "
              f"| {truth.get('edge_5')} | {truth.get('edge_30')} | {row['trials']} | {row['wall_s']} | {row['cpu_s']} "
              f"| {row['left']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
