"""The edge of a plain training process on a dataset's worst batch, and at its mean length: a check of ``data:``.

    python benchmarks/harness/data_edge.py SPEC.yaml [--budget BYTES] [--start N] [--json]

For a spec with a ``data`` section (a language model whose collate_fn pads a
batch of token-id tensors to its longest), each trial is a fresh ``python -c``
process that imports only torch, builds the dataset, measures every sample's
length itself (``len(sample)``), takes the B longest (its own sort), collates
them with the user's collate_fn, builds the model and runs the spec's steps of
the classic loop under the CPU cap (``RLIMIT_DATA``, set before exec, and the
environment ``plain_edge.environment`` writes out). Nothing of isoprobe runs in
the trial. It also bisects the edge at the dataset's mean length, with
``plain_edge``'s own trial on a fixed input of that many tokens: what a probe
of the average batch would answer.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import plain_edge  # noqa: E402 - the same environment, the same bisection
from isoprobe.spec.load import load_spec  # noqa: E402 - the parent only: trials never import isoprobe

#: The trial: the dataset's B longest samples, the user's collate_fn, the classic language-model loop.
TRIAL = r"""
import json, sys
config = json.loads(sys.argv[1])
try:
    import importlib.util
    import torch
    import torch.nn.functional as F

    def function(reference):
        path, name = reference.rsplit(":", 1)
        module_spec = importlib.util.spec_from_file_location("user_" + name, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return getattr(module, name)

    dataset = function(config["dataset"])(**config["dataset_kwargs"])
    lengths = [len(dataset[i]) for i in range(len(dataset))]
    longest = sorted(range(len(dataset)), key=lambda i: lengths[i], reverse=True)[:config["batch"]]
    model = function(config["factory"])(**config["kwargs"])
    model.train()
    optimizer = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[
        config["optimizer"]](model.parameters(), **config["optimizer_kwargs"])
    collate = function(config["collate_fn"])
    x = collate([dataset[i] for i in longest])
    for step in range(config["steps"]):
        if step and config["input_lifetime"] == "through_next_batch":
            x = collate([dataset[i] for i in longest])  # a DataLoader loop's next batch, the previous still bound
        optimizer.zero_grad(set_to_none=True)
        outputs = model(x)
        logits = outputs[:, :-1, :].float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        del logits
        loss.backward()
        optimizer.step()
    print(json.dumps({"longest": lengths[longest[0]], "shortest": lengths[longest[-1]]}))
except (MemoryError, RuntimeError) as error:
    if isinstance(error, MemoryError) or "can't allocate memory" in str(error):
        sys.exit(3)
    raise
"""


def trial_config(spec, batch: int) -> dict:
    """What the trial needs; SystemExit for a spec this loop does not reproduce."""
    data, model = spec.data, spec.model
    task = spec.target.resolved_task if spec.target is not None else None
    if data is None or data.collate_fn is None or data.length is not None or task != "language_modeling" or \
            model.factory is None or model.loss or model.step or spec.training != type(spec.training)() or \
            spec.device != "cpu":
        raise SystemExit("data_edge.py reproduces a language model from model.factory on data with a collate_fn "
                         "and the default length, trained in fp32 on the CPU with default training options")
    kwargs = dict(spec.optimizer.kwargs)
    return {"dataset": data.dataset, "dataset_kwargs": data.kwargs, "collate_fn": data.collate_fn,
            "factory": model.factory, "kwargs": model.kwargs, "optimizer": spec.optimizer.name,
            "optimizer_kwargs": kwargs, "steps": spec.search.steps, "batch": batch,
            "input_lifetime": spec.training.input_lifetime}


def worst_batch_fits(spec, batch: int, budget: int, python: str = sys.executable) -> bool:
    """One trial on the B longest samples, in a fresh plain process under ``RLIMIT_DATA`` = ``budget``."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (budget, budget))

    run = subprocess.run([python, "-c", TRIAL, json.dumps(trial_config(spec, batch))],
                         env=plain_edge.environment(spec), preexec_fn=cap, capture_output=True, text=True, cwd="/")
    if run.returncode not in (plain_edge.FITS, plain_edge.OUT_OF_MEMORY):
        raise RuntimeError(f"batch {batch}: the plain trial failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return run.returncode == plain_edge.FITS


def worst_edge(spec, budget: int, start: int = 8, report=lambda batch, fit: None) -> int:
    """The largest worst batch (the B longest samples) a plain process trains under the budget."""
    return plain_edge.bisect_edge(lambda batch: worst_batch_fits(spec, batch, budget), start, report)


def mean_length(spec) -> float:
    """The dataset's mean length, measured in this process (the one place the parent imports the user's code)."""
    path, name = spec.data.dataset.rsplit(":", 1)
    sys.path.insert(0, str(Path(path).parent))
    module = __import__(Path(path).stem)
    dataset = getattr(module, name)(**spec.data.kwargs)
    return statistics.mean(len(dataset[i]) for i in range(len(dataset)))


def at_length(spec_path: str, length: int, vocabulary: int) -> dict:
    """The spec as a fixed-shape one at ``length`` tokens (no data section): the average batch's question."""
    from isoprobe.spec.load import load_spec as load

    spec = load(spec_path)
    plain = spec.model_dump(mode="json", exclude_unset=False)
    plain.pop("data")
    plain["input"] = {"shape": [length], "dtype": "int64", "high": vocabulary}
    return plain


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--budget", type=int, default=None, help="bytes (default: the spec's memory_budget)")
    parser.add_argument("--start", type=int, default=8, help="the first batch tried")
    parser.add_argument("--vocabulary", type=int, default=8000, help="token ids of the mean-length input: [0, this)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    budget = args.budget or spec.memory_budget
    trial_config(spec, 1)
    say = lambda what: lambda b, fit: print(f"{what} batch {b:>6}: {'fits' if fit else 'out_of_memory'}",  # noqa: E731
                                           file=sys.stderr, flush=True)
    worst = worst_edge(spec, budget, args.start, say("worst"))
    mean = round(mean_length(spec))
    from isoprobe.spec.model import Spec

    at_mean = plain_edge.edge(Spec.model_validate(at_length(args.spec, mean, args.vocabulary)), budget,
                              args.start, say(f"length {mean}"))
    found = {"worst_batch_edge": worst, "mean_length": mean, "mean_length_edge": at_mean, "budget": budget}
    print(json.dumps(found) if args.json else f"{args.spec}: worst batch {worst}, at the mean length {mean}: {at_mean}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
