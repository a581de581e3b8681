"""The estimate before any trial, on the parent's side: the search's prior, the result's prediction,
``isoprobe estimate``.

The child traces one training step without real memory (``child.core.estimate``)
and sends a ``protocol.Estimate``. Here it becomes three things, none of which
imports torch: the ``search.Prior`` the guided search starts from, the
``result.Prediction`` reported next to the measured answer (with its error),
and the ``EstimateReport`` that ``isoprobe estimate`` prints on its own.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from isoprobe.protocol.messages import Estimate
from isoprobe.report.device import DeviceInfo
from isoprobe.report.insights import Prediction
from isoprobe.search.history import Prior
from isoprobe.spec.model import Spec
from isoprobe.spec.units import format_bytes


def prior_of(estimate: Estimate | None) -> Prior | None:
    """The search's prior line, or None where there is no usable estimate (the search then starts as without one)."""
    if estimate is None or estimate.per_sample_bytes is None or estimate.fixed_bytes is None:
        return None
    if not (estimate.per_sample_bytes > 0 and math.isfinite(estimate.per_sample_bytes)):
        return None
    return Prior(float(estimate.fixed_bytes), float(estimate.per_sample_bytes))


def predicted_max(estimate: Estimate | None, capacity: int | None) -> int | None:
    """The largest batch whose predicted peak is within ``capacity`` (0 when not even one sample fits)."""
    prior = prior_of(estimate)
    if prior is None or capacity is None:
        return None
    return max(0, math.floor((capacity - prior.intercept) / prior.slope))


def prediction(estimate: Estimate | None, capacity: int | None, measured_max: int | None) -> Prediction | None:
    """What the result reports: the estimate, its predicted maximum, and its relative error against the answer."""
    if estimate is None:
        return None
    predicted = predicted_max(estimate, capacity)
    error = None
    if predicted is not None and measured_max:
        error = round((predicted - measured_max) / measured_max, 4)
    return Prediction(
        fixed_bytes=estimate.fixed_bytes,
        per_sample_bytes=estimate.per_sample_bytes,
        predicted_max=predicted,
        error=error,
        seconds=estimate.seconds,
        note=estimate.note,
    )


class EstimateReport(BaseModel):
    """What ``isoprobe estimate SPEC`` prints: the traced estimate alone, no trial run."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["estimate"] = "estimate"
    spec_path: str
    torch_version: str
    device: DeviceInfo = Field(description="Where the trials would run, and the capacity the maximum is predicted for.")
    estimate: Estimate = Field(description="The traced estimate (per_sample_bytes null: none, and note says why).")
    predicted_max: int | None = Field(
        None,
        description="The largest batch whose predicted peak is within device.capacity_bytes; null without an estimate.",
    )
    seconds: float = Field(description="Wall time of the command (the environment check's process included).")
    note: str = Field(description="What the numbers are: a prediction; 'isoprobe run' proves the answer.")


def report_of(spec: Spec, spec_path: str, facts, device: DeviceInfo, capacity: int, seconds: float) -> EstimateReport:
    estimate = facts.estimate or Estimate(note="the environment check sent none back")
    return EstimateReport(
        spec_path=spec_path,
        torch_version=facts.torch_version,
        device=device,
        estimate=estimate,
        predicted_max=predicted_max(estimate, capacity),
        seconds=round(seconds, 3),
        note="a prediction from one traced step, no trial run: 'isoprobe run' proves the exact edge "
        "(the trace sees tensors only: allocator caching, fragmentation and kernel scratch memory are not in it)",
    )


def no_estimate(estimate: Estimate | None) -> str:
    """The one way a missing estimate is said: 'no estimate: REASON' (``Estimate.note`` holds the reason alone, so
    no caller repeats 'not estimated' or what the search does without one)."""
    reason = estimate.note if estimate is not None and estimate.note else "the environment check sent none back"
    return f"no estimate: {reason}"


def render_report(report: EstimateReport) -> str:
    """The report as a table for people."""
    e = report.estimate
    rows = [
        ("spec", report.spec_path),
        ("device", f"{report.device.backend} ({report.device.name})"),
        ("capacity", format_bytes(report.device.capacity_bytes)),
    ]
    if e.per_sample_bytes is None:
        rows.append(("estimate", no_estimate(e)))
    else:
        rows += [
            ("parameters", format_bytes(e.parameter_bytes)),
            ("gradients", format_bytes(e.gradient_bytes)),
            ("optimizer state", format_bytes(e.optimizer_state_bytes)),
            ("buffers", format_bytes(e.buffer_bytes)),
        ]
        if e.baseline_bytes is not None:
            label = "import baseline" if report.device.backend == "cpu" else "in use on the card (context)"
            rows.append((label, format_bytes(e.baseline_bytes)))
        if e.runtime_bytes is not None:
            rows.append(("runtime (threads, arenas)", format_bytes(e.runtime_bytes)))
        rows += [
            ("fixed part", format_bytes(e.fixed_bytes)),
            ("activations per sample", format_bytes(e.per_sample_bytes)),
            ("predicted maximum", str(report.predicted_max)),
            ("traced at batches", ", ".join(str(b) for b in e.traced_batch_sizes)),
        ]
        if e.note:
            rows.append(("note", e.note))
    rows.append(("took", f"{report.seconds:.1f} s (trace {e.seconds:.1f} s)"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows) + f"\n\n{report.note}"
