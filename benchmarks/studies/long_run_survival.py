"""How often a batch survives a long run: N independent fresh-process runs of each batch, and the spread.

    python benchmarks/studies/long_run_survival.py specs/gru-lm.yaml --strategy fsdp --batch 57 58 --runs 10 --steps 30
    python benchmarks/studies/long_run_survival.py --hf-trainer benchmarks/specs/heldout/convnet_trainer.py:build_trainer \
        --memory-budget 1280MiB --batch 31 32 --runs 10 --steps 30
    python benchmarks/studies/long_run_survival.py --loop benchmarks/specs/heldout/convnet.py:train \
        --memory-budget 1280MiB --batch 34 --runs 8 --steps 30

Why it exists (issue 34): near the edge the same batch fits in one fresh process and runs out of memory in
the next (heap fragmentation on the CPU), so one run proves nothing about the next. This runs each batch
``--runs`` times in fresh processes that import nothing of isoprobe, with the two independent harnesses:

- a spec's model as a plain loop (``steady_harness.run_batch``: one process, or gloo ranks under DDP,
  ZeRO-1 or FSDP2), which also reports each step's peak in the cap's units, so the *spread* can be read:
  how far the peak a run reaches by step ``--steps`` lies above the peak at the step where isoprobe's
  steady rule (``report/steady.py``'s window and tolerance, written again here) would have stopped that
  run, and how far those steady peaks lie apart from run to run;
- a Hugging Face Trainer built by ``FILE.py:FUNCTION`` (``hf_trainer_edge.run_plain``: ``trainer.train()``
  with ``max_steps``), which tells survived or out of memory;
- a user's own loop, ``--loop FILE.py:FUNCTION`` called as ``FUNCTION(batch, steps)`` in a fresh interpreter
  (``benchmarks/specs/heldout/convnet.py:train``: the plain loop of benchmarks/studies/peers.py, a DataLoader and its step),
  which tells survived or out of memory.

Every process runs under the cap of isoprobe's CPU trials (``RLIMIT_DATA`` before exec, the malloc
setting, no CUDA), at ``OMP_NUM_THREADS=1`` unless ``--threads`` says otherwise. Prints a table on stdout;
``--json FILE`` keeps every run's record.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "harness"  # the harnesses it runs
sys.path.insert(0, str(HERE))

from steady_harness import load_spec, parse_bytes, run_batch  # noqa: E402

#: report/steady.py's rule, written again (nothing of isoprobe is imported): 5 steps within 256 KiB.
WINDOW, TOLERANCE = 5, 256 << 10
MIB = 1 << 20


def steady_step(peaks: list[int], min_steps: int = 2) -> int | None:
    """The step (1-based) at which the steady rule would have stopped a run with these running peaks."""
    for count in range(max(min_steps, WINDOW + 1), len(peaks) + 1):
        if peaks[count - 1] - peaks[count - 1 - WINDOW] <= TOLERANCE:
            return count
    return None


def one_plain(options, spec, batch: int) -> dict:
    cap = parse_bytes(options.memory_budget or spec["memory_budget"])
    result = run_batch(options.spec, spec, options.strategy, batch, options.steps, cap, options.world_size,
                       options.threads, options.timeout)
    peaks = result["peaks"]
    at = steady_step(peaks)
    return {"batch": batch, "survived": result["survived"], "oom_step": result["oom_step"],
            "steady_step": at, "steady_peak": peaks[at - 1] if at else None,
            "final_peak": peaks[-1] if peaks else None, "peaks": peaks, "cap": cap, "seconds": result["seconds"]}


def one_trainer(options, batch: int) -> dict:
    from hf_trainer_edge import FITS, OUT_OF_MEMORY, run_plain

    started = time.monotonic()
    run = run_plain(options.hf_trainer, json.loads(options.kwargs), batch, parse_bytes(options.memory_budget),
                    options.steps)
    if run.returncode not in (FITS, OUT_OF_MEMORY):
        raise RuntimeError(f"batch {batch}: the plain Trainer failed (exit {run.returncode}):\n{run.stderr[-2000:]}")
    return {"batch": batch, "survived": run.returncode == FITS, "oom_step": None,
            "seconds": round(time.monotonic() - started, 1)}


#: The user's loop at one batch, nothing of isoprobe imported: exit 3 on an allocation failure.
LOOP = r"""
import importlib.util, json, sys
config = json.loads(sys.argv[1])
spec = importlib.util.spec_from_file_location("user_loop", config["path"])
loop = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loop)
try:
    getattr(loop, config["function"])(config["batch"], config["steps"])
except (MemoryError, RuntimeError) as error:
    if isinstance(error, MemoryError) or "can't allocate memory" in str(error):
        sys.exit(3)
    raise
"""


def one_loop(options, batch: int) -> dict:
    from hf_trainer_edge import environment

    path, function = options.loop.rsplit(":", 1)
    cap = parse_bytes(options.memory_budget)
    started = time.monotonic()
    config = {"path": str(Path(path).resolve()), "function": function, "batch": batch, "steps": options.steps}
    run = subprocess.run([sys.executable, "-c", LOOP, json.dumps(config)], capture_output=True, text=True,
                         env=environment() | {"OMP_NUM_THREADS": options.threads}, cwd=str(Path(path).parent),
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (cap, cap)),
                         timeout=options.timeout)
    if run.returncode not in (0, 3):
        raise RuntimeError(f"batch {batch}: the loop failed (exit {run.returncode}):\n{run.stderr[-2000:]}")
    return {"batch": batch, "survived": run.returncode == 0, "oom_step": None,
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", type=Path, nargs="?")
    parser.add_argument("--hf-trainer", help="FILE.py:FUNCTION returning a transformers.Trainer (instead of a spec)")
    parser.add_argument("--loop", help="FILE.py:FUNCTION, called as FUNCTION(batch, steps) (instead of a spec)")
    parser.add_argument("--kwargs", default="{}")
    parser.add_argument("--strategy", choices=("none", "ddp", "zero1", "fsdp"), default="none")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch", type=int, nargs="+", required=True)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--memory-budget")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", type=Path, help="append every run's record to this file (JSON lines)")
    options = parser.parse_args(argv)
    if sum(x is not None for x in (options.spec, options.hf_trainer, options.loop)) != 1:
        parser.error("give one of a spec, --hf-trainer or --loop")
    if options.loop and not options.memory_budget:
        parser.error("--loop needs --memory-budget")
    if options.hf_trainer:
        options.hf_trainer = str(Path(options.hf_trainer.rsplit(":", 1)[0]).resolve()) + ":" + \
            options.hf_trainer.rsplit(":", 1)[1]
        os.environ["OMP_NUM_THREADS"] = options.threads
        if not options.memory_budget:
            parser.error("--hf-trainer needs --memory-budget")
    spec = load_spec(options.spec) if options.spec else None
    runs: dict[int, list[dict]] = {b: [] for b in options.batch}
    for index in range(options.runs):  # alternate the batches, so load changes hit each alike
        for batch in options.batch:
            record = (one_trainer(options, batch) if options.hf_trainer else one_loop(options, batch) if options.loop
                      else one_plain(options, spec, batch))
            record["run"] = index + 1
            runs[batch].append(record)
            if options.json:
                with open(options.json, "a") as file:
                    file.write(json.dumps(record) + "\n")
            how = "survived" if record["survived"] else f"out of memory at step {record['oom_step']}"
            print(f"run {index + 1} batch {batch}: {how} ({record['seconds']} s)", file=sys.stderr, flush=True)
    print(f"| batch | survived {options.steps} steps | steady peak, MiB (min-max) | peak at step {options.steps} "
          "above the run's steady peak, MiB (max) | spread: highest long-run peak above the lowest steady one, MiB |")
    print("|---|---|---|---|---|")
    for batch, records in runs.items():
        survived = sum(r["survived"] for r in records)
        steady = [r["steady_peak"] for r in records if r.get("steady_peak")]
        finals = [r["final_peak"] for r in records if r.get("final_peak") and r["survived"]]
        creep = [r["final_peak"] - r["steady_peak"] for r in records if r.get("steady_peak") and r["survived"]]
        steady_text = f"{min(steady) / MIB:.1f}-{max(steady) / MIB:.1f}" if steady else "-"
        creep_text = f"{max(creep) / MIB:.2f}" if creep else "-"
        spread = f"{(max(finals) - min(steady)) / MIB:.2f}" if steady and finals else "-"
        print(f"| {batch} | {survived} of {len(records)} | {steady_text} | {creep_text} | {spread} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
