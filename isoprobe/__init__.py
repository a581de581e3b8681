"""isoprobe: the exact largest training batch that fits, found one fresh process per trial.

The tree is the pipeline, one package per layer (docs/architecture.md has the rules, which
tests/unit/test_layering.py enforces):

    pure, imported by both sides
        errors.py       every error isoprobe raises on purpose, and the exit codes
        spec/           the question: YAML (and overrides) -> one validated ``Spec``
        report/         the answer: the ``Result`` contract, the outcomes, and every view of it
        protocol/       the contract between parent and trial: typed requests in, events out
        system/         the OS's primitives: the keeper, PID 1, OOM-kill records, hardware facts
    pure decisions (no processes)
        search/         the edge search over a trial oracle, recommendation, soak, plan
    the parent (never imports torch)
        cli/            the command line: arguments, output formats, exit codes
        api.py          ``probe()`` for Python scripts
        huggingface.py  ``find_batch_size(build_trainer)``: probe()'s answer for a Hugging Face Trainer
        lightning.py    ``IsolatedBatchSizeFinder``: the Lightning callback, each trial in a fresh process
        pipeline/       the orchestration: cache -> environment check -> search -> recommendation -> Result
        executors/      the seam to processes: ``local`` (isolated children), ``gang``, ``scripted`` (tests)
        cache/          answers kept on disk, trusted while their sources are unchanged
        sweep/          many specs, locally or as Slurm jobs
    the trial's process (the only code that imports torch)
        child/          ``python -m isoprobe.child``: builds the workload, runs real training steps

The Python API (``api.py``)::

    from isoprobe import probe, load_spec, SpecError
    result = probe("spec.yaml", memory_budget="8GiB")   # a Result; never imports torch here

This module stays import-light on purpose: the child imports it before torch,
and ``import isoprobe`` must stay fast for the CLI and for scripts. So the names
below are imported on first use (module ``__getattr__``), not here.
"""

__version__ = "0.1.0"

#: The public names, and the module each comes from (imported when first asked for).
_LAZY = {
    "probe": "isoprobe.api",
    "load_spec": "isoprobe.spec.load",
    "Spec": "isoprobe.spec.model",
    "Result": "isoprobe.report.result",
    "StopReason": "isoprobe.report.outcomes",
    "IsoprobeError": "isoprobe.errors",
    "SpecError": "isoprobe.errors",
    "ProbeError": "isoprobe.errors",
    "Problem": "isoprobe.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
