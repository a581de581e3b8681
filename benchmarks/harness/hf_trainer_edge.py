"""A Hugging Face Trainer's true edge under the CPU cap, found without isoprobe; and ``auto_find_batch_size``'s answer.

    python benchmarks/harness/hf_trainer_edge.py FILE.py:FUNCTION --budget BYTES [--kwargs JSON] [--steps 5]
        [--check N] [--start N] [--auto-find FROM] [--isoprobe SPEC.yaml] [--json]

The function is what ``model.hf_trainer`` names: ``f(batch_size, **kwargs)`` returning a
``transformers.Trainer``. Each trial here is a fresh ``python -c`` process that imports the
function's file, builds its Trainer at one batch, sets ``max_steps`` (and nothing that
writes: no saving, reporting or progress bar), and calls ``trainer.train()``; exit 0 when
it trains, 3 on an allocation failure. It runs under the cap a CPU trial of isoprobe
runs under (``RLIMIT_DATA`` = the budget, set before exec; ``MALLOC_MMAP_THRESHOLD_``;
no CUDA device), the values written out here, not imported: nothing of isoprobe is in
the trial's process, which is the point.

- ``--check N``: only N and N+1 (is N the edge: N trains, N+1 does not?);
- otherwise the edge is bisected (doubling from ``--start``), assuming that a batch which
  trains means every smaller one does;
- ``--auto-find FROM``: one more process under the same cap, the same Trainer built at
  FROM with ``auto_find_batch_size=True`` (Accelerate's ``find_executable_batch_size``, in
  that process: the in-process finder isoprobe replaces): its answer and time;
- ``--isoprobe SPEC``: ``isoprobe run SPEC --no-cache`` too, timed, for a side-by-side table.
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

#: What a CPU trial's environment sets that changes its memory (``executors.processes.child_environment``).
MALLOC_MMAP_THRESHOLD = "131072"
FITS, OUT_OF_MEMORY = 0, 3

#: One plain trial: build, train ``steps`` optimizer steps (or, with auto_find, let the Trainer search).
TRIAL = r"""
import json, sys, time
config = json.loads(sys.argv[1])
started = time.perf_counter()
try:
    import importlib.util
    path, function = config["builder"].rsplit(":", 1)
    module_spec = importlib.util.spec_from_file_location("user_trainer", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    trainer = getattr(module, function)(config["batch"], **config["kwargs"])
    args = trainer.args
    args.max_steps = config["steps"]
    args.save_strategy = "no"
    args.report_to = []
    args.disable_tqdm = True
    args.logging_strategy = "no"
    from transformers.trainer_callback import ProgressCallback
    trainer.remove_callback(ProgressCallback)
    tried = []  # with auto_find: the batch of each try (each calls the inner loop, which calls on_train_begin)
    if config["auto_find"]:
        args.auto_find_batch_size = True
        from transformers import TrainerCallback

        class Tried(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                tried.append(state.train_batch_size)

        trainer.add_callback(Tried())
    trainer.train()
    print(json.dumps({"batch": trainer._train_batch_size, "tried": tried, "seconds": time.perf_counter() - started}))
except (MemoryError, RuntimeError) as error:
    if isinstance(error, MemoryError) or "can't allocate memory" in str(error) or "out of memory" in str(error):
        sys.exit(3)
    raise
"""


def environment() -> dict[str, str]:
    """The trial's environment: this one, plus what a CPU trial of isoprobe gets that changes memory."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MALLOC_MMAP_THRESHOLD_")}
    env.update(MALLOC_MMAP_THRESHOLD_=MALLOC_MMAP_THRESHOLD, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def run_plain(builder: str, kwargs: dict, batch: int, budget: int, steps: int, auto_find: bool = False,
              python: str = sys.executable) -> subprocess.CompletedProcess:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (budget, budget))

    config = {"builder": builder, "kwargs": kwargs, "batch": batch, "steps": steps, "auto_find": auto_find}
    return subprocess.run([python, "-c", TRIAL, json.dumps(config)], env=environment(), preexec_fn=cap,
                          capture_output=True, text=True, cwd=str(Path(builder.rsplit(":", 1)[0]).parent))


def trains(builder: str, kwargs: dict, batch: int, budget: int, steps: int) -> bool:
    """One plain trial; raises on anything but trains or out of memory."""
    run = run_plain(builder, kwargs, batch, budget, steps)
    if run.returncode not in (FITS, OUT_OF_MEMORY):
        raise RuntimeError(f"batch {batch}: the plain trial failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return run.returncode == FITS


def edge(builder: str, kwargs: dict, budget: int, steps: int, start: int = 8, report=lambda b, fit: None) -> int:
    """The largest batch that trains in a plain process (0 if not even one): plain_edge.py's bisection."""
    from plain_edge import bisect_edge

    return bisect_edge(lambda batch: trains(builder, kwargs, batch, budget, steps), start, report)


def auto_find(builder: str, kwargs: dict, start: int, budget: int, steps: int) -> dict:
    """``auto_find_batch_size=True`` from ``start`` in one process under the cap: its batch, the batches it tried
    and seconds (wall)."""
    started = time.perf_counter()
    run = run_plain(builder, kwargs, start, budget, steps, auto_find=True)
    wall = time.perf_counter() - started
    if run.returncode != 0:
        return {"batch": None, "seconds": wall, "failed": run.stderr[-1000:]}
    return {**json.loads(run.stdout.strip().splitlines()[-1]), "seconds": wall}


def isoprobe_run(spec: str) -> dict:
    """``isoprobe run SPEC --no-cache``: its answer, trials and wall time (end to end, imports included)."""
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "isoprobe", "run", spec, "--no-cache", "--format", "json"],
                         capture_output=True, text=True, cwd=str(Path(__file__).resolve().parents[2]))
    wall = time.perf_counter() - started
    result = json.loads(run.stdout)
    return {"max": result["max_batch_size"], "recommended": result["recommended_batch_size"],
            "trials": len(result["trials"]), "seconds": wall, "exit": run.returncode}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builder", help="FILE.py:FUNCTION returning a transformers.Trainer")
    parser.add_argument("--budget", type=int, required=True, help="RLIMIT_DATA in bytes")
    parser.add_argument("--kwargs", default="{}", help="JSON keyword arguments for the function")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--check", type=int, help="only check that N trains and N+1 does not")
    parser.add_argument("--start", type=int, default=8)
    parser.add_argument("--auto-find", type=int, metavar="FROM", help="also auto_find_batch_size from FROM")
    parser.add_argument("--isoprobe", metavar="SPEC", help="also isoprobe run SPEC --no-cache (first)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    builder = str(Path(args.builder.rsplit(":", 1)[0]).resolve()) + ":" + args.builder.rsplit(":", 1)[1]
    kwargs = json.loads(args.kwargs)
    out: dict = {"budget": args.budget, "steps": args.steps}

    def say(batch: int, fit: bool) -> None:
        print(f"plain batch {batch:>5}: {'trains' if fit else 'out_of_memory'}", file=sys.stderr, flush=True)

    if args.isoprobe:
        out["isoprobe"] = isoprobe_run(args.isoprobe)
        print(f"isoprobe: {out['isoprobe']}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    if args.check is not None:
        below = trains(builder, kwargs, args.check, args.budget, args.steps)
        say(args.check, below)
        above = trains(builder, kwargs, args.check + 1, args.budget, args.steps)
        say(args.check + 1, above)
        out["check"] = {"batch": args.check, "trains": below, "next_trains": above, "is_edge": below and not above}
    else:
        out["edge"] = edge(builder, kwargs, args.budget, args.steps, args.start, report=say)
    out["plain_seconds"] = time.perf_counter() - started
    if args.auto_find is not None:
        out["auto_find"] = auto_find(builder, kwargs, args.auto_find, args.budget, args.steps)
    if args.json:
        print(json.dumps(out))
        return 0
    true_edge = out.get("edge", args.check if out.get("check", {}).get("is_edge") else None)
    print(f"{'':<28}{'answer':>8}{'true edge':>11}{'trials':>8}{'seconds':>9}")
    if "isoprobe" in out:
        iso = out["isoprobe"]
        print(f"{'isoprobe (hf_trainer)':<28}{iso['max']!s:>8}{true_edge!s:>11}{iso['trials']:>8}{iso['seconds']:>9.1f}")
    if "auto_find" in out:
        af = out["auto_find"]
        print(f"{'auto_find_batch_size':<28}{af['batch']!s:>8}{true_edge!s:>11}{'-':>8}{af['seconds']:>9.1f}")
    print(f"plain fresh-process check: {out.get('check') or {'edge': out['edge']}} in {out['plain_seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
