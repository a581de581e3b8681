"""One spec under every distributed strategy, side by side: the per-rank edge, its peak, trials and seconds.

    python benchmarks/studies/distributed_table.py specs/gpt2-fsdp.yaml [--world-size 2] [--memory-budget 3GiB]

Runs ``isoprobe run`` (fresh probes, no cache) with the ``distributed`` section set
to none (with torch's default threads, and again at one thread: the ranks' count
as torchrun starts them, so the row to compare them with), ddp, zero1 and fsdp in turn (``--set``; the spec's own strategy keeps its
options), one after another so that they do
not share the cores, and prints a Markdown table: what docs/distributed.md
records. The numbers are the probes' own; nothing here is computed that the
results do not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

STRATEGIES = ("none", "ddp", "zero1", "fsdp")


def probe(spec: str, strategy: str, world_size: int, budget: str | None, threads: str | None = None
          ) -> tuple[dict, float]:
    # The section is replaced whole (the spec's own options belong to its own strategy), except for the
    # spec's own strategy, which keeps its options with the world size asked for.
    own = _own_strategy(spec)
    section = "{strategy: none}" if strategy == "none" else f"{{strategy: {strategy}, world_size: {world_size}}}"
    command = [sys.executable, "-m", "isoprobe", "run", spec, "--no-cache", "--format", "json"]
    if strategy == own == "none":
        pass
    elif strategy == own:
        command += ["--set", f"distributed.world_size={world_size}"]
    else:
        command += ["--set", f"distributed={section}"]
    if budget:
        command += ["--memory-budget", budget]
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if not done.stdout.strip():
        raise SystemExit(f"{strategy}: isoprobe exited {done.returncode} without a result:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout), seconds


def _own_strategy(spec: str) -> str:
    import yaml

    with open(spec) as file:
        return ((yaml.safe_load(file) or {}).get("distributed") or {}).get("strategy", "none")


def row(strategy: str, result: dict, seconds: float, threads: str | None = None) -> str:
    """One Markdown row; ``threads``: the OMP_NUM_THREADS the probe was started with (None: inherited)."""
    distributed = result.get("distributed") or {}
    threads = distributed.get("threads_per_rank") or threads or os.environ.get("OMP_NUM_THREADS") or "torch's default"
    maximum = result["max_batch_size"]
    at_max = [t for t in result["trials"] if t["batch_size"] == maximum and t["outcome"] == "fits"]
    peak = max((t["budget_peak_bytes"] or 0) for t in at_max) if at_max else None
    breakdown = result.get("memory_breakdown") or {}
    sizes = next((t["sizes"] for t in result["trials"] if t.get("sizes")), None) or {}
    mib = 1024**2

    def shown(value):
        return "-" if value is None else f"{value / mib:.0f}"

    return (f"| {strategy} | {threads} | {maximum} | {result['first_failing_batch_size']} | {shown(peak)} | "
            f"{shown(breakdown.get('fixed_bytes'))} | {shown(sizes.get('parameter_bytes'))} / "
            f"{shown(sizes.get('gradient_bytes'))} / {shown(sizes.get('optimizer_state_bytes'))} | "
            f"{len(result['trials'])} | {seconds:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--memory-budget")
    args = parser.parse_args()
    print(f"{args.spec}, world size {args.world_size} (per-rank batches; MiB in the budget's units)\n")
    print("| strategy | threads a process | max per rank | first failing | peak at the max (MiB) | fixed part (MiB) | "
          "params / grads / state per rank (MiB) | trials | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for strategy in STRATEGIES:
        result, seconds = probe(args.spec, strategy, args.world_size, args.memory_budget)
        print(row(strategy, result, seconds), flush=True)
        if strategy == "none" and "OMP_NUM_THREADS" not in os.environ:
            # One process at one thread too: the ranks run one each (as torchrun starts them), so this is the
            # row to compare them with; the row above is what a single-process job with torch's default gets.
            result, seconds = probe(args.spec, strategy, args.world_size, args.memory_budget, threads="1")
            print(row(strategy, result, seconds, threads="1"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
