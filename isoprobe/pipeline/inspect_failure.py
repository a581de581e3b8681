"""Why the environment check failed, in words: the phase it stopped in, and the spec field an ``InspectProblem``
names (``pipeline.environment.inspect_environment`` raises with these).

A failure is said by the last phase the check's child reported (``started``, ``warm``, ``imported``, a data scan's
progress, ``model_built``), so that "it hung importing your model's package" is told apart from "building the model
ran out of memory", and an unfinished estimate trace is a note, not a failure.
"""

from __future__ import annotations

from isoprobe.errors import Problem
from isoprobe.executors import ChildRun
from isoprobe.pipeline.classify import signal_name_of
from isoprobe.protocol.messages import (
    DataScanning,
    Imported,
    InspectProblem,
    ModelBuilt,
    Started,
    Warm,
)
from isoprobe.spec.model import Spec

_WATCHDOG_HEADLINE = "Timeout ("


def unfinished_trace(run: ChildRun, spec: Spec) -> str:
    """Why no estimate came back after the check's verdict, as far as the run shows (``Estimate.note``: the reason
    alone); the search goes on without one."""
    if run.timed_out:
        how = f"was still running at the check's timeout (search.trial_timeout, {spec.search.trial_timeout:g} s)"
    elif run.returncode == 1 and _WATCHDOG_HEADLINE in run.stderr_tail:
        how = (
            "ran past its own time limit where it could not be interrupted (in C code or a blocking call), "
            f"and the check's process was ended after {run.seconds:.0f} s"
        )
    else:
        signal_name = signal_name_of(run.returncode)
        how = f"ended the check's process ({signal_name or f'exit status {run.returncode}'})"
    return f"the environment check's trace of a step {how}"


def inspect_failure(run: ChildRun, spec: Spec) -> str:
    """What people read when the environment check gave no answer: how it ended, and in which phase.

    The phase comes from the child's last event and says only what that event
    proves: ``started`` (importing), ``warm`` (imported; from then on the check
    reports nothing until its answer, so it names all it does then),
    ``imported`` and ``model_built`` where a check reports them, and with
    spec.data ``data_scan`` (building the dataset, scanning its lengths, done).
    """
    model = spec.workload.replace(" ", ": ", 1)
    phase, importing = _inspect_phase(run.events, model)
    scan = _data_phase(run.events, spec, model)
    if scan is not None:
        phase = scan[0]
    if run.timed_out and importing:
        how = f"was stopped after {run.seconds:.0f} s"
        fix = " Importing should take seconds: check the Python environment and its filesystem."
    elif run.timed_out:
        how = f"was stopped after search.trial_timeout ({spec.search.trial_timeout:g} s)"
        fix = scan[1] if scan is not None else " If the model is this slow to build, raise search.trial_timeout."
    else:
        signal_name = signal_name_of(run.returncode)
        how = f"was killed by {signal_name}" if signal_name else f"exited with status {run.returncode}"
        how += " without an answer"
        fix = ""
    return f"the environment check (a child process) {how}. {phase}{fix}"


def _data_phase(events: list, spec: Spec, model: str) -> tuple[str, str] | None:
    """Where the check's pass over spec.data's dataset was, if it was the check's last report (``DataScanning``),
    and the fix for a check stopped there; None when the check was not in that pass."""
    last = next(
        (e for e in reversed(events) if isinstance(e, (Started, Warm, Imported, ModelBuilt, DataScanning))), None
    )
    if not isinstance(last, DataScanning) or spec.data is None:
        return None
    dataset = f"data.dataset: {spec.data.dataset}"
    if last.stage == "building":
        return (
            f"Its last report was that it was building the dataset ({dataset}, called with data.kwargs): the "
            "factory had not returned.",
            " If the dataset is this slow to build, raise search.trial_timeout (every trial builds it too).",
        )
    if last.stage == "scanning":
        sampled = "" if last.scanning == last.samples else f" (data.scan_limit {spec.data.scan_limit})"
        return (
            f"Its last report was that it was scanning the dataset ({dataset}): reading {last.scanning} of its "
            f"{last.samples} samples{sampled} to find the longest, one dataset[i] and one length each (then "
            "the longest again, to check that they do not change).",
            " Lower data.scan_limit (the lengths of a seeded sample of that many are read), make dataset[i] "
            "faster, or raise search.trial_timeout.",
        )
    return (
        f"Its last report was that it had scanned the dataset ({dataset}, {last.scanning} of {last.samples} "
        f"samples); it was then building the model ({model}) on the meta device and checking the "
        "spec's options.",
        " If the model is this slow to build, raise search.trial_timeout.",
    )


def _inspect_phase(events: list, model: str) -> tuple[str, bool]:
    """Where the check was, as far as its last event shows, and whether that was still its imports."""
    last = next((e for e in reversed(events) if isinstance(e, (Started, Warm, Imported, ModelBuilt))), None)
    if isinstance(last, ModelBuilt):
        return (
            f"Its last report was 'model_built': it had built the model ({model}) and was checking the "
            "optimizer and the training options.",
            False,
        )
    if isinstance(last, Imported):
        return f"Its last report was 'imported': it was building the model ({model}).", False
    if isinstance(last, Warm):
        return (
            f"It had imported {', '.join(last.modules) or 'nothing ahead'}; after that it looks at the GPUs, "
            f"builds the model ({model}) on the meta device and checks the spec's options, and reports nothing "
            "until its answer.",
            False,
        )
    if isinstance(last, Started):
        return "Its last report was 'started': it was importing torch and the model library.", True
    return "It reported nothing: it did not get past starting Python.", True


_INSPECT_STAGES = {
    # stage: (field, what went wrong, how to fix it)
    "model": ("model", "cannot be built", "check the name, the factory's module and function, and the kwargs"),
    "optimizer": ("optimizer.kwargs", "cannot be built", "check the optimizer's keyword arguments"),
    "allocator": (
        "allocator",
        "rejected by torch",
        "check the allocator string (keys such as expandable_segments:True, max_split_size_mb:128)",
    ),
    "input": ("input.shape", "does not fit the model", "set input.shape to what the model takes for one sample"),
    "target": (
        "target",
        "does not match the model's output",
        "set target.classes (or target.shape) to the model's output, or change the model's kwargs",
    ),
    "precision": ("training.precision", "cannot run on this device", "use fp32 or a precision the device supports"),
    "checkpointing": (
        "training.gradient_checkpointing",
        "cannot be applied to this model",
        "turn it off, or wrap the model's blocks in nn.Sequential stages in the factory",
    ),
    "batch": ("model.batch", "cannot be loaded", "check the module and function name"),
    "loss": ("model.loss", "cannot be loaded", "check the module and function name"),
    "step": (
        "model.step",
        "cannot be used as the training step",
        "define it as def train_step(model, optimizer, batch, device) in the named module",
    ),
    "hf_trainer": (
        "model.hf_trainer",
        "cannot be used to build the Trainer",
        "define it as def build_trainer(batch_size, **kwargs) returning a transformers.Trainer, and give "
        "model.kwargs that it takes",
    ),
    "lightning": (
        "model.lightning",
        "cannot be built",
        "name a LightningModule class or a function returning one, and check model.kwargs",
    ),
    "datamodule": (
        "model.datamodule",
        "cannot be built",
        "name a LightningDataModule class or a function returning one, and check model.datamodule_kwargs",
    ),
    "data.dataset": (
        "data.dataset",
        "cannot be used",
        "return a non-empty map-style torch.utils.data.Dataset (len() and dataset[i]) from the function, "
        "built the same way each time; check its module, name and data.kwargs",
    ),
    "data.collate_fn": (
        "data.collate_fn",
        "does not make a batch of the longest samples that the model takes",
        "return a tensor, a pair (inputs, targets) or a dict of the model's keyword arguments from "
        "a list of samples, as your DataLoader's collate_fn does",
    ),
    "data.determinism": (
        "data.dataset",
        "returns different samples for the same index",
        "make dataset[i] return the same sample on every read, in every build of the dataset and in "
        "every process: seed its randomness from the index, or return each sample at its longest "
        "for the probe",
    ),
    "data.length": (
        "data.length",
        "cannot give the samples' lengths",
        "return a number from one sample (e.g. len(sample['input_ids'])), or leave data.length unset",
    ),
    "batch_arg_name": (
        "lightning.batch_arg_name",
        "cannot be set",
        "give the module or data module that attribute, or name the one it has",
    ),
    "eval_pass": (
        "training.eval_pass",
        "cannot run",
        "pass one eval_dataset to the Trainer that model.hf_trainer builds, or set training.eval_pass: false",
    ),
}


def inspect_problem(problem: InspectProblem) -> Problem:
    field, what, fix = _INSPECT_STAGES[problem.stage]
    return Problem(field, f"{what}: {problem.type}: {problem.message}", fix)
