"""The edge a plain training process finds under the CPU cap: an independent check of isoprobe's maximum.

    python benchmarks/harness/plain_edge.py SPEC.yaml [--budget BYTES] [--start N] [--json] [--eval-after T]

Each trial is a fresh ``python -c`` process that imports only torch (and the
model's library), builds the spec's model, and runs the spec's steps of the
classic loop (``outputs = model(x); loss = F.cross_entropy(outputs, y);
loss.backward(); optimizer.step()``), exiting 0 when they fit and 3 on an
allocation failure. It runs under the cap a CPU trial runs under
(``RLIMIT_DATA`` = the budget, set before exec) and in the environment that
changes memory (``MALLOC_MMAP_THRESHOLD_``, no CUDA devices, the thread
count), with the values written out here, not imported: nothing of isoprobe's
trial code (child, protocol, pydantic) is in the trial's process, which is the
point. The parent reads the spec with isoprobe's loader only.

The edge is bisected (doubling from ``--start``, then halving the gap), one
process per batch, assuming that a batch which fits means every smaller one
fits. Specs whose options this loop does not reproduce (mixed precision,
compile, a user step or loss, ...) are refused rather than approximated.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from isoprobe.spec.load import load_spec  # noqa: E402 - the parent only: trials never import isoprobe

#: What a CPU trial's environment sets that changes its memory (``executors.processes.child_environment``),
#: written out on purpose: the harness must not follow the code it checks.
MALLOC_MMAP_THRESHOLD = "131072"
FITS, OUT_OF_MEMORY = 0, 3

#: The trial: a plain process with the classic loop. ``outputs`` and ``loss`` are loop variables, so the
#: previous step's output lives until the next forward pass has returned, as in a user's script.
TRIAL = r"""
import json, sys
config = json.loads(sys.argv[1])
try:
    import importlib, importlib.util
    import torch
    import torch.nn.functional as F
    source = config["model"]
    if source["torchvision"]:
        import torchvision
        model = torchvision.models.get_model(source["torchvision"], weights=None, **source["kwargs"])
    else:
        path, function = source["factory"].rsplit(":", 1)
        if path.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location("user_models", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(path)
        model = getattr(module, function)(**source["kwargs"])
    model.train()
    kwargs = dict(config["optimizer_kwargs"])
    if config["optimizer"] == "sgd":
        kwargs.setdefault("lr", 0.01)
        kwargs.setdefault("momentum", 0.9)
    optimizer = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[
        config["optimizer"]](model.parameters(), **kwargs)
    shape = [config["batch"], *config["shape"]]

    def make():
        if config["dtype"] == "int64":
            return torch.randint(0, config["high"], shape)
        return torch.randn(shape, dtype=getattr(torch, config["dtype"]))

    x = make()
    y = x if config["task"] == "language_modeling" else None
    for step in range(config["steps"]):
        if step and config["input_lifetime"] == "through_next_batch":
            # A DataLoader loop's next batch, built while the previous one is still bound.
            x = make()
            y = x if config["task"] == "language_modeling" else y
        optimizer.zero_grad(set_to_none=True)
        outputs = model(x)
        if config["task"] == "language_modeling":
            logits = outputs[:, :-1, :].float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1))
            del logits
        else:
            if y is None:
                y = torch.randint(0, config["classes"], (outputs.shape[0], *outputs.shape[2:]))
            loss = F.cross_entropy(outputs, y)
        loss.backward()
        optimizer.step()
    if config["eval_batch"]:
        # Validation after the epoch: the epoch's batch and output are gone, the weights, gradients and optimizer
        # state stay (the next step's zero_grad has not run), and one evaluation batch runs without gradients.
        del outputs, loss, x, y
        model.eval()
        shape = [config["eval_batch"], *config["shape"]]
        if config["dtype"] == "int64":
            x = torch.randint(0, config["high"], shape)
        else:
            x = torch.randn(shape, dtype=getattr(torch, config["dtype"]))
        with torch.inference_mode() if config["eval_grad"] == "inference_mode" else torch.no_grad():
            outputs = model(x)
    # The data segment's peak, as a CPU trial reads it (VmPeak less what is not data), for margins to the cap.
    status = {line.split(":")[0]: int(line.split()[1]) for line in open("/proc/self/status")
              if line.startswith(("VmPeak", "VmSize", "VmData"))}
    print("peak_data_bytes", (status["VmPeak"] - (status["VmSize"] - status["VmData"])) * 1024)
except (MemoryError, RuntimeError) as error:
    if isinstance(error, MemoryError) or "can't allocate memory" in str(error):
        sys.exit(3)
    raise
"""


def trial_config(spec, batch: int, eval_batch: int | None = None) -> dict:
    """What the trial process needs from the spec; SystemExit naming the option this loop does not reproduce.

    ``eval_batch``: after the steps at ``batch``, one evaluation pass at this batch (training.eval_pass's edge).
    """
    training, model = spec.training, spec.model
    unsupported = {
        "training.mode": training.mode != "train",
        "training.precision": training.precision != "fp32",
        "training.channels_last": training.channels_last,
        "training.gradient_checkpointing": training.gradient_checkpointing,
        "training.compile": training.compile,
        "training.eval_pass": training.eval_pass and eval_batch is None,
        "training.output_lifetime": training.output_lifetime != "through_backward",
        "model.batch / model.loss / model.step": bool(model.batch or model.loss or model.step),
        "model.timm / model.huggingface": bool(model.timm or model.huggingface),
        "distributed": spec.distributed.gang,
        "device": spec.device != "cpu",
    }
    named = [name for name, used in unsupported.items() if used]
    task = spec.target.resolved_task if spec.target is not None else None
    if task not in ("classification", "segmentation", "language_modeling"):
        named.append(f"target task {task}")
    if named:
        raise SystemExit(f"plain_edge.py does not reproduce {', '.join(named)}: use a spec without them")
    return {
        "model": {"torchvision": model.torchvision, "factory": model.factory, "kwargs": model.kwargs},
        "optimizer": spec.optimizer.name, "optimizer_kwargs": spec.optimizer.kwargs,
        "shape": list(spec.input.shape), "dtype": spec.input.dtype, "high": spec.input.high,
        "task": task, "classes": spec.target.classes, "steps": spec.search.steps, "batch": batch,
        "eval_batch": eval_batch, "eval_grad": training.eval_grad, "input_lifetime": training.input_lifetime,
    }


def environment(spec) -> dict[str, str]:
    """The trial's environment: this one, plus what a CPU trial of isoprobe gets that changes memory."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MALLOC_MMAP_THRESHOLD_")}
    env.update(MALLOC_MMAP_THRESHOLD_=MALLOC_MMAP_THRESHOLD, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
               PYTHONFAULTHANDLER="1")
    if spec.distributed.threads_per_rank is not None:
        env["OMP_NUM_THREADS"] = str(spec.distributed.threads_per_rank)
    return env


def fits(spec, batch: int, budget: int, python: str = sys.executable, eval_batch: int | None = None) -> bool:
    """One trial in a fresh plain process under ``RLIMIT_DATA`` = ``budget``; raises on anything but fit or OOM.

    ``eval_batch``: the steps at ``batch``, then one evaluation pass at ``eval_batch``, which decides.
    """
    return peak(spec, batch, budget, python, eval_batch) is not None


def peak(spec, batch: int, budget: int, python: str = sys.executable, eval_batch: int | None = None) -> int | None:
    """One trial as ``fits`` runs it: the data segment's peak in bytes when it fits, None when it runs out."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (budget, budget))

    run = subprocess.run([python, "-c", TRIAL, json.dumps(trial_config(spec, batch, eval_batch))], env=environment(spec),
                         preexec_fn=cap, capture_output=True, text=True, cwd="/")
    if run.returncode not in (FITS, OUT_OF_MEMORY):
        raise RuntimeError(f"batch {batch}: the plain trial failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    if run.returncode == OUT_OF_MEMORY:
        return None
    return int(run.stdout.split("peak_data_bytes")[-1].split()[0])


def edge(spec, budget: int, start: int = 8, report=lambda batch, fit: None) -> int:
    """The largest batch that fits in a plain process (0 if not even one): double from ``start``, then bisect."""
    return bisect_edge(lambda batch: fits(spec, batch, budget), start, report)


def bisect_edge(fits_at, start: int = 8, report=lambda batch, fit: None) -> int:
    """The largest batch for which ``fits_at(batch)`` is True (0 if not even 1), assuming that a batch which
    fits means every smaller one fits: double from ``start``, then halve the gap. The harnesses of other loops
    (lightning_edge.py, hf_trainer_edge.py) bisect with it too."""
    lo, hi = 0, None  # lo fits (0: trivially), hi does not
    batch = max(1, start)
    while hi is None:
        fit = fits_at(batch)
        report(batch, fit)
        if fit:
            lo, batch = batch, batch * 2
        else:
            hi = batch
    while hi - lo > 1:
        batch = (lo + hi) // 2
        fit = fits_at(batch)
        report(batch, fit)
        lo, hi = (batch, hi) if fit else (lo, batch)
    return lo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--budget", type=int, default=None, help="bytes (default: the spec's memory_budget)")
    parser.add_argument("--start", type=int, default=8, help="the first batch tried")
    parser.add_argument("--json", action="store_true", help="print {'edge': N, 'budget': B} instead of text")
    parser.add_argument("--eval-after", type=int, default=None, metavar="T",
                        help="the evaluation edge instead: the steps at batch T, then one evaluation pass at the "
                             "batch bisected (training.eval_pass)")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    budget = args.budget or spec.memory_budget
    if budget is None:
        raise SystemExit("plain_edge.py needs a budget: the spec's memory_budget or --budget")
    trial_config(spec, 1, args.eval_after)  # refuse an unsupported spec before any trial
    report = lambda b, fit: print(f"batch {b:>6}: {'fits' if fit else 'out_of_memory'}", file=sys.stderr,  # noqa: E731
                                  flush=True)
    if args.eval_after is None:
        found = edge(spec, budget, args.start, report=report)
    else:
        found = bisect_edge(lambda b: fits(spec, args.eval_after, budget, eval_batch=b), args.start, report)
    print(json.dumps({"edge": found, "budget": budget}) if args.json else f"{args.spec}: plain edge {found}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
