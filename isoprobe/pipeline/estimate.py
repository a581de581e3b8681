"""``isoprobe estimate``: the environment check alone, and the traced estimate it brings back. No trial runs.

The same child as a probe's first step (versions, devices, the model on the
meta device, then one step traced on fake tensors), the same target resolution
(the budget, the capacity), and the prediction read off the estimate
(``isoprobe.pipeline.prediction``). Seconds, not minutes, and no GPU memory beyond the
check's own context.
"""

from __future__ import annotations

import time
from pathlib import Path

from isoprobe.pipeline.environment import inspect_environment, resolve_target
from isoprobe.pipeline.prediction import EstimateReport, report_of
from isoprobe.spec.model import Spec


def estimate_spec(spec: Spec, spec_path: str, budget_source: str = "spec", executor=None) -> EstimateReport:
    """Run the environment check for ``spec`` and report its estimate (SpecError / ProbeError as ``run`` raises)."""
    started = time.monotonic()
    python_path = [str(Path(spec_path).resolve().parent)]
    if executor is None:
        from isoprobe.executors.local import LocalExecutor

        executor = LocalExecutor()
    try:
        facts = inspect_environment(spec, spec_path, executor, python_path)
    finally:
        executor.close()
    target = resolve_target(spec, facts, budget_source, spec_path)
    return report_of(spec, spec_path, facts, target.info, target.search_capacity, time.monotonic() - started)
