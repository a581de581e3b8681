"""The edge of a plain ``trainer.fit`` under the CPU cap, and Lightning's own finder beside isoprobe's answer.

    python benchmarks/harness/lightning_edge.py SPEC.yaml [--budget BYTES] [--start N] [--json]
    python benchmarks/harness/lightning_edge.py SPEC.yaml --compare [--survive 50]

The spec names a LightningModule (``model.lightning``). Each trial is a fresh
``python -c`` process that imports only lightning, builds the module (and data
module) from their files, sets the batch size in ``on_fit_start`` with
``lightning_setattr`` (where Lightning's BatchSizeFinder sets it) and runs
``trainer.fit`` for the spec's steps with the spec's Trainer arguments; exit 0
when they ran, 3 on an allocation failure. It runs under the cap a CPU trial
runs under (``RLIMIT_DATA`` = the budget, set before exec) in the environment
that changes memory (``MALLOC_MMAP_THRESHOLD_``, no CUDA devices), with the
values written out here, not imported: nothing of isoprobe's trial code is in
the trial's process, which is the point. The parent reads the spec with
isoprobe's loader only. The edge is bisected (doubling from ``--start``), one
process per batch, assuming that a batch which fits means every smaller one fits.

``--compare`` prints, for the same module under the same cap: isoprobe's answer
(``isoprobe run --no-cache`` in a subprocess: wall time including its imports,
trials), Lightning's ``Tuner.scale_batch_size(mode="binsearch")`` run in one
capped process as a user would (answer, trials, wall time including imports),
and the plain edge; with ``--survive N``, whether each answer trains N steps.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from isoprobe.spec.load import load_spec  # noqa: E402 - the parent only: trials never import isoprobe

#: What a CPU trial's environment sets that changes its memory (``executors.processes.child_environment``),
#: written out on purpose: the harness must not follow the code it checks.
MALLOC_MMAP_THRESHOLD = "131072"
FITS, OUT_OF_MEMORY = 0, 3
_PRECISION = {"fp32": "32-true", "fp16-mixed": "16-mixed", "bf16-mixed": "bf16-mixed", "bf16-true": "bf16-true"}

_COMMON = r"""
import json, sys, time
config = json.loads(sys.argv[1])
started = time.perf_counter()
import importlib, importlib.util
import lightning as L
from lightning.pytorch.utilities.parsing import lightning_setattr

def load(reference):
    path, name = reference.rsplit(":", 1)
    if path.endswith(".py") or "/" in path:
        spec = importlib.util.spec_from_file_location("user_module", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["user_module"] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(path)
    return getattr(module, name)

module = load(config["module"])(**config["kwargs"])
datamodule = load(config["datamodule"])(**config["datamodule_kwargs"]) if config["datamodule"] else None
arguments = dict(accelerator="cpu", devices=1, precision=config["precision"], logger=False,
                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                 limit_val_batches=0, num_sanity_val_steps=0)
arguments.update(config["trainer"])  # a check that validates (issue 55) passes its own limit_val_batches
"""

#: A plain fit at one batch size.
TRIAL = _COMMON + r"""
class SetBatch(L.Callback):
    def on_fit_start(self, trainer, pl_module):
        lightning_setattr(pl_module, config["name"], config["batch"])

try:
    trainer = L.Trainer(max_steps=config["steps"], callbacks=[SetBatch()], **arguments)
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == config["steps"], trainer.global_step
except (MemoryError, RuntimeError) as error:
    if isinstance(error, MemoryError) or "can't allocate memory" in str(error):
        sys.exit(3)
    raise
"""

#: Lightning's own finder, in one process, as its documentation runs it (its defaults: binsearch ends with a
#: 5 % margin below what it found). The module's ``on_train_start`` records the batch of each trial: every
#: trial's loop run calls it (the finder clears the Trainer's callbacks while it searches, so a callback would
#: not see them), while the finder's own log has no line for a trial that ends its search.
FINDER = _COMMON + r"""
from lightning.pytorch.tuner import Tuner
from lightning.pytorch.utilities.parsing import lightning_getattr

tried, on_train_start = [], module.on_train_start

def record_trial():
    tried.append(lightning_getattr(module, config["name"]))
    on_train_start()

module.on_train_start = record_trial
trainer = L.Trainer(max_steps=config["steps"], **arguments)
found = Tuner(trainer).scale_batch_size(module, datamodule=datamodule, mode="binsearch", init_val=config["start"],
                                        steps_per_trial=config["steps"], max_trials=25, batch_arg_name=config["name"])
print(json.dumps({"answer": found, "tried": tried, "seconds": time.perf_counter() - started}))
"""


def trial_config(spec, batch: int, steps: int | None = None) -> dict:
    """What the trial process needs from the spec; SystemExit where it is not a Lightning spec this runs."""
    if spec.model.lightning is None or spec.distributed.gang or spec.device != "cpu":
        raise SystemExit("lightning_edge.py runs model.lightning specs on device cpu, one process")
    lightning = spec.lightning
    trainer = {"accumulate_grad_batches": lightning.accumulate_grad_batches if lightning else 1}
    if lightning and lightning.gradient_clip_val is not None:
        trainer["gradient_clip_val"] = lightning.gradient_clip_val
    if lightning and lightning.gradient_clip_algorithm is not None:
        trainer["gradient_clip_algorithm"] = lightning.gradient_clip_algorithm
    return {"module": spec.model.lightning, "kwargs": spec.model.kwargs, "datamodule": spec.model.datamodule,
            "datamodule_kwargs": spec.model.datamodule_kwargs, "precision": _PRECISION[spec.training.precision],
            "trainer": trainer, "name": lightning.batch_arg_name if lightning else "batch_size",
            "steps": steps or spec.search.steps, "batch": batch, "start": spec.search.start_batch_size}


def environment() -> dict[str, str]:
    """The trial's environment: this one, plus what a CPU trial of isoprobe gets that changes memory."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MALLOC_MMAP_THRESHOLD_")}
    env.update(MALLOC_MMAP_THRESHOLD_=MALLOC_MMAP_THRESHOLD, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    return env


def _capped(script: str, config: dict, budget: int, python: str) -> subprocess.CompletedProcess:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (budget, budget))

    return subprocess.run([python, "-c", script, json.dumps(config)], env=environment(), preexec_fn=cap,
                          capture_output=True, text=True, cwd="/tmp")


def fits(spec, batch: int, budget: int, steps: int | None = None, python: str = sys.executable,
         validate_every: int | None = None) -> bool:
    """One plain fit in a fresh process under ``RLIMIT_DATA`` = ``budget``; raises on anything but fit or OOM.
    ``validate_every``: the fit validates (two batches of the module's own val_dataloader) every that many training
    batches, as a user's ``val_check_interval`` has it; else it never validates."""
    config = trial_config(spec, batch, steps)
    if validate_every is not None:
        config["trainer"].update(limit_val_batches=2, val_check_interval=validate_every, check_val_every_n_epoch=None)
    run = _capped(TRIAL, config, budget, python)
    if run.returncode not in (FITS, OUT_OF_MEMORY):
        raise RuntimeError(f"batch {batch}: the plain fit failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return run.returncode == FITS


def edge(spec, budget: int, start: int = 8, report=lambda batch, fit: None) -> int:
    """The largest batch that fits in a plain fit (0 if not even one): plain_edge.py's bisection."""
    from plain_edge import bisect_edge

    return bisect_edge(lambda batch: fits(spec, batch, budget), start, report)


def lightning_finder(spec, budget: int, python: str = sys.executable) -> dict:
    """Lightning's binsearch in one capped process: its answer (and before its margin), the batches it tried, and
    the wall time including imports."""
    started = time.perf_counter()
    run = _capped(FINDER, trial_config(spec, 0), budget, python)
    seconds = time.perf_counter() - started
    if run.returncode != 0:
        return {"answer": None, "seconds": seconds, "error": run.stderr[-2000:]}
    found = json.loads(run.stdout.strip().splitlines()[-1])
    margin = re.search(r"reducing batch size from (\d+) to (\d+)", run.stderr)
    return {"answer": found["answer"], "seconds": seconds, "trials": len(found["tried"]), "tried": found["tried"],
            "before_margin": int(margin.group(1)) if margin else found["answer"]}


def isoprobe_answer(spec_path: str, budget: int) -> dict:
    """``isoprobe run --no-cache`` as a user runs it: its maximum, trials, and wall time including imports."""
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "isoprobe", "run", spec_path, "--no-cache", "--memory-budget",
                          str(budget)], capture_output=True, text=True, cwd=str(Path(__file__).resolve().parents[2]))
    seconds = time.perf_counter() - started
    result = json.loads(run.stdout)
    return {"answer": result["max_batch_size"], "recommended": result["recommended_batch_size"],
            "trials": len(result["trials"]), "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--budget", type=int, default=None, help="bytes (default: the spec's memory_budget)")
    parser.add_argument("--start", type=int, default=8, help="the first batch the plain edge tries")
    parser.add_argument("--json", action="store_true", help="print {'edge': N, 'budget': B} instead of text")
    parser.add_argument("--compare", action="store_true", help="isoprobe and Lightning's binsearch beside the edge")
    parser.add_argument("--survive", type=int, default=0, help="with --compare: train each answer this many steps")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    budget = args.budget or spec.memory_budget
    if budget is None:
        raise SystemExit("lightning_edge.py needs a budget: the spec's memory_budget or --budget")
    trial_config(spec, 1)  # refuse an unsupported spec before any trial

    def say(batch: int, fit: bool) -> None:
        print(f"batch {batch:>6}: {'fits' if fit else 'out_of_memory'}", file=sys.stderr, flush=True)

    if not args.compare:
        found = edge(spec, budget, args.start, report=say)
        print(json.dumps({"edge": found, "budget": budget}) if args.json else f"{args.spec}: plain edge {found}")
        return 0
    rows = {"isoprobe": isoprobe_answer(args.spec, budget), "lightning binsearch": lightning_finder(spec, budget)}
    true_edge = edge(spec, budget, args.start, report=say)
    print(f"{'':22}{'answer':>8}{'true edge':>11}{'trials':>8}{'wall s':>9}" + (f"{'survives':>10}" if args.survive else ""))
    for name, row in rows.items():
        line = f"{name:22}{row['answer']!s:>8}{true_edge:>11}{row.get('trials', '-')!s:>8}{row['seconds']:>9.1f}"
        if args.survive and row["answer"]:
            line += f"{'yes' if fits(spec, row['answer'], budget, args.survive) else 'no':>10}"
        print(line, flush=True)
    if args.json:
        print(json.dumps({"edge": true_edge, "budget": budget, **rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
