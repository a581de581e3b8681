"""The sweep's contract: one row per spec x GPU type, as a pydantic model, and its table for people.

A row is built from a ``Result`` (``row_from_result``: the full result stays in
the cache, the row points at it) or from a reason (``failed_row``: a bad spec, a
task that died, a cancelled array). The JSON document (``SweepReport``) is what
``isoprobe sweep --format json`` prints; the table is rendered from it, so the
two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from isoprobe.report.strict import Strict

if TYPE_CHECKING:
    from isoprobe.report.result import Result

#: The target of a local sweep's rows: the machine the sweep runs on.
LOCAL_TARGET = "local"


class SweepRow(Strict):
    """One spec on one GPU type: the answer's headline numbers, or why there is none."""

    spec: str = Field(description="The spec file's path, as given on the command line.")
    target: str = Field(
        description=(
            "Where it was probed: 'local', or the Slurm 'partition=NAME' or 'constraint=FEATURE' of its GPU type."
        )
    )
    answered: bool = Field(
        description="True when max_batch_size is a proven answer (the exit code 0 of 'isoprobe run')."
    )
    max_batch_size: int | None = Field(None, description="The largest batch that fit; null without an answer.")
    recommended_batch_size: int | None = Field(
        None, description="The batch to train with (headroom and rounding applied)."
    )
    stop_reason: str | None = Field(
        None,
        description="Why the probe stopped (edge_found, capped, start_does_not_fit, error, ...); null if it never ran.",
    )
    device: str | None = Field(None, description="The GPU (or, on the CPU backend, the CPU) the trials ran on.")
    trials: int | None = Field(
        None, description="Trials the answer took (those of the probe that made the cached entry)."
    )
    seconds: float | None = Field(
        None, description="The probe's wall time in seconds (for a cached row: the original probe's, not this sweep's)."
    )
    cached: bool = Field(
        False, description="True when the row was answered from the cache: no trial ran for it in this sweep."
    )
    cache_path: str | None = Field(
        None, description="The cache entry holding the full result (isoprobe show PATH renders it)."
    )
    job_id: str | None = Field(
        None, description="The Slurm array task that probed it (ARRAYJOB_TASK); null locally or cached."
    )
    node: str | None = Field(
        None, description="The node that Slurm array task ran on (SLURMD_NODENAME); null locally or cached."
    )
    error: str | None = Field(
        None, description="Why the row has no answer: the probe's message, a spec problem, or how the task ended."
    )


class SweepReport(Strict):
    """What ``isoprobe sweep`` found: every row, and what the sweep itself cost."""

    executor: Literal["local", "slurm"] = Field(description="Where the probes ran.")
    rows: list[SweepRow] = Field(description="One per spec x target, in the order the specs and targets were given.")
    submitted: int = Field(
        description="Probes handed to the executor in this sweep (0: every row came from the cache)."
    )
    array_jobs: list[str] = Field(default_factory=list, description="The Slurm job arrays submitted (one per target).")
    interrupted: Literal["interrupted", "terminated"] | None = Field(
        None,
        description="Set when Ctrl-C ('interrupted') or SIGTERM ('terminated') stopped the sweep (its jobs cancelled).",
    )
    seconds: float = Field(description="The sweep's wall time in seconds.")

    @property
    def all_answered(self) -> bool:
        return all(row.answered for row in self.rows)


def row_from_result(spec: str, target: str, result: Result, job_id: str | None = None) -> SweepRow:
    """The row for a probe's (or a cache hit's) ``Result``."""
    return SweepRow(
        spec=spec,
        target=target,
        answered=result.answered,
        max_batch_size=result.max_batch_size,
        recommended_batch_size=result.recommended_batch_size,
        stop_reason=result.stop_reason.value,
        device=result.device.name if result.device else None,
        trials=len(result.trials),
        seconds=round(result.total_seconds, 2),
        cached=bool(result.cache and result.cache.hit),
        cache_path=result.cache.path if result.cache else None,
        job_id=job_id,
        error=None if result.answered else result.message,
    )


def failed_row(spec: str, target: str, reason: str, job_id: str | None = None) -> SweepRow:
    """A row without an answer: ``reason`` says why, for people."""
    return SweepRow(spec=spec, target=target, answered=False, job_id=job_id, error=reason)


def render_sweep_table(report: SweepReport) -> str:
    """The rows as aligned columns, then one line for the sweep (what ran, what came from the cache)."""
    header = ("spec", "target", "node", "max", "recommended", "trials", "seconds", "cache", "result / error")
    lines = [header]
    for row in report.rows:
        outcome = " ".join((row.error or row.cache_path or row.stop_reason or "").split())  # one line per row
        lines.append(
            (
                row.spec,
                row.target,
                _shown(row.node),
                _shown(row.max_batch_size),
                _shown(row.recommended_batch_size),
                _shown(row.trials),
                "-" if row.seconds is None else f"{row.seconds:.1f}",
                "hit" if row.cached else ("-" if row.error else "new"),
                outcome if len(outcome) <= 120 else outcome[:117] + "...",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    # widths leaves out the last column (outcome, not padded): zip stops before it.
    text = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)) + "  " + line[-1]
        for line in lines
    ]
    answered = sum(row.answered for row in report.rows)
    cached = sum(row.cached for row in report.rows)
    arrays = f" in {', '.join(report.array_jobs)}" if report.array_jobs else ""
    tail = f"; {report.interrupted}: its jobs were cancelled" if report.interrupted else ""
    text.append(
        f"{answered}/{len(report.rows)} answered, {cached} from the cache, {report.submitted} probed{arrays} "
        f"({report.executor}), {report.seconds:.1f} s{tail}"
    )
    return "\n".join(text)


def _shown(value) -> str:
    return "-" if value is None else str(value)


@dataclass(frozen=True)
class SweepItem:
    """What one probe of a sweep needs: the spec, its overrides, where to answer and where to write the row."""

    spec: str  #: the spec's absolute path (a task on another node reads it there: a shared filesystem)
    shown: str  #: the path as the user gave it (and the --over value): the row names the spec by it
    target: str  #: 'local', 'partition=NAME' or 'constraint=FEATURE'
    cache_dir: str  #: the result cache (ISOPROBE_CACHE_DIR), absolute; set in the task's environment
    index: int = 0  #: the row's position in the sweep
    named: dict = field(default_factory=dict)  #: {'--device': ..., '--memory-budget': ..., '--max-batch-size': ...}
    sets: tuple[str, ...] = ()  #: --set FIELD=VALUE texts, applied to every spec
    refresh: bool = False  #: probe again and replace the cached answer
    rows_dir: str | None = None  #: where the row's JSON goes (a Slurm task), or None (in process)

    def load(self):
        """The spec with the sweep's overrides, checked as ``isoprobe validate`` checks it (``SpecError``)."""
        from isoprobe.spec.load import check_references, load_spec

        spec = load_spec(self.spec, self.named, sets=self.sets)
        check_references(spec, self.spec)
        return spec

    def budget_source(self) -> str:
        named = self.named.get("--memory-budget") is not None
        return (
            "command line"
            if named or any(s.partition("=")[0].strip() == "memory_budget" for s in self.sets)
            else "spec"
        )
