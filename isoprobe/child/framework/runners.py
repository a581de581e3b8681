"""The user's own training loop run as the trial: a framework's trainer in place of isoprobe's ``Step``.

For a model source that names a framework's trainer (``spec.model.source`` in
``FRAMEWORK_RUNNERS``), the trial builds the user's own trainer in this fresh
process and lets the framework's loop run, so what fits is what that loop
allocates (its precision plugin, clipping, accumulation, the user's own step and
data). A runner is ``run(request, events, progress, torch, device) -> dict``:

- build what the user named, then emit ``ModelBuilt`` (``progress.phase = "model_built"``);
- make a ``child.core.step_report.StepHook`` and call ``begin()`` before each optimizer
  step and ``after_step()`` after it, from the framework's own per-step callback,
  and stop the framework's loop as soon as ``after_step()`` is True (the request's
  steps, or the steady rule: the parent judges the same events as for ``Step``);
  set the framework's step limit to ``hook.most_steps`` so it never runs past;
- let an exception out unwrapped to what the framework wrapped (an out-of-memory
  error must reach ``outcomes.classify_exception`` as itself);
- return the end readings (``final_readings``), after dropping its references to
  the trainer, model and batch where it can.

Each runner is imported only for its own source, so a trial imports one framework.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from isoprobe.child.core import cuda as child_cuda
from isoprobe.child.core.memory import cpu_readings
from isoprobe.report.trial import Sizes

#: ``spec.model.source`` -> the runner, ``"module:function"``.
FRAMEWORK_RUNNERS: dict[str, str] = {
    "hf_trainer": "isoprobe.child.framework.hf_trainer_runner:run_trainer",
    "lightning": "isoprobe.child.framework.lightning_runner:run",
}


def framework_runner(source: str | None) -> Callable[..., dict[str, Any]] | None:
    """The runner for ``source``, or None when isoprobe's own ``Step`` runs the trial (or no source is named)."""
    target = FRAMEWORK_RUNNERS.get(source) if source is not None else None
    if target is None:
        return None
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def final_readings(
    torch: Any, device: Any, sizes: Sizes | None = None, step_peaks: Sequence[int] = ()
) -> dict[str, Any]:
    """The peak readings a trial reports with its verdict (``TrialResult`` fields), as ``child.core.trial`` reads them;
    ``step_peaks``: the steps' budget readings (on CUDA the verdict's is never below them)."""
    if device.type == "cuda":
        return child_cuda.readings(torch, device, sizes or Sizes(), max(step_peaks, default=None))
    return cpu_readings()


def framework_cycle(request: Any, hook: Any, evaluated: list[int], early: bool, batches: int) -> dict[str, Any]:
    """The ``cycle`` a framework's trial reports (``report.cycle.CycleSeen``): where its early evaluation was read
    (``evaluated``: the step whose reading first includes it), for a trial asked to see the cycle; nothing else."""
    if request.cycle is None:
        return {}
    from isoprobe.report.cycle import CycleSeen

    step = evaluated[0] if evaluated and evaluated[0] <= hook.steps_done else None
    peak = hook.peaks[step - 1] if step is not None else None
    return {
        "cycle": CycleSeen(
            steps=hook.steps_done,
            evaluation_step=step,
            evaluation_forwards=batches if step else None,
            evaluation_peak_bytes=peak,
            waited=early,
            bound=None if early else "unconfigured",
        )
    }
