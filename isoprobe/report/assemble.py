"""The ``Result`` of a probe, assembled in one place from what the pipeline established.

The pipeline (``pipeline.pipeline.run_probe``) hands over three parts, each a frozen record of plain values: where
and how the probe ran (``Setting``), what the search answered (``Answer``), and what else the result shows
(``Views``). The rules that only restate those values (an answer stands for an edge found or a cap reached; the
edge is flaky when a flaky batch lies at or above the maximum) live here, so that no caller restates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from isoprobe.report.device import AllocatorInfo, DeviceInfo, DistributedInfo
from isoprobe.report.edge import AllocatorComparison, DataInfo, EdgeMargin, TokenBudget
from isoprobe.report.insights import MemoryBreakdown, Prediction, Throughput
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report.recommendation import AccumulationPlan, Recommendation
from isoprobe.report.result import Result
from isoprobe.report.trial import Trial
from isoprobe.spec.model import Spec


@dataclass(frozen=True)
class Setting:
    """Where and how the probe ran."""

    spec_path: str
    spec: Spec
    isoprobe_version: str
    python_version: str
    torch_version: str | None
    torchvision_version: str | None
    device: DeviceInfo
    allocator: AllocatorInfo
    job_environment: dict[str, str]
    distributed: DistributedInfo | None
    data: DataInfo | None


@dataclass(frozen=True)
class Answer:
    """What the search, the recommendation and the deciding trials established."""

    stop: StopReason
    max_fitting: int | None
    first_failing: int | None
    first_failing_outcome: Outcome | None = None
    short_max: int | None = None
    flaky: tuple[int, ...] = ()
    limited_by: str | None = None
    recommended: int | None = None
    recommendation: Recommendation | None = None
    edge_margin: EdgeMargin | None = None
    max_steady: bool = False
    max_cycle: str | None = None
    max_confirmed: bool = False


@dataclass(frozen=True)
class Evaluated:
    """The evaluation batch's own edge (``eval_*`` fields)."""

    max_fitting: int | None
    first_failing: int | None
    training_batch: int | None
    stop: StopReason | None


@dataclass(frozen=True)
class Views:
    """What else the result shows: each kind's part and the insights read from the trials."""

    throughput: Throughput | None = None
    memory_breakdown: MemoryBreakdown | None = None
    prediction: Prediction | None = None
    accumulation: AccumulationPlan | None = None
    allocator_comparison: AllocatorComparison | None = None
    tokens: TokenBudget | None = None
    evaluated: Evaluated | None = None
    trials: list[Trial] = field(default_factory=list)


def assemble_result(
    setting: Setting, answer: Answer, views: Views, message: str, suggestions: list[str], total_seconds: float
) -> Result:
    """The one ``Result`` of a probe that ran its trials."""
    evaluated = views.evaluated
    return Result(
        isoprobe_version=setting.isoprobe_version,
        python_version=setting.python_version,
        torch_version=setting.torch_version,
        torchvision_version=setting.torchvision_version,
        spec_path=setting.spec_path,
        spec=setting.spec,
        device=setting.device,
        allocator=setting.allocator,
        job_environment=setting.job_environment,
        answered=answer.stop in (StopReason.EDGE_FOUND, StopReason.CAPPED),
        max_batch_size=answer.max_fitting,
        first_failing_batch_size=answer.first_failing,
        short_max_batch_size=answer.short_max,
        edge_margin=answer.edge_margin,
        max_steady=answer.max_steady,
        max_cycle=answer.max_cycle,
        max_confirmed=answer.max_confirmed,
        first_failing_outcome=answer.first_failing_outcome,
        flaky_batch_sizes=list(answer.flaky),
        edge_flaky=any(answer.max_fitting is None or b >= answer.max_fitting for b in answer.flaky),
        limited_by=answer.limited_by,
        recommended_batch_size=answer.recommended,
        recommendation=answer.recommendation,
        throughput=views.throughput,
        memory_breakdown=views.memory_breakdown,
        eval_max_batch_size=evaluated.max_fitting if evaluated else None,
        eval_first_failing_batch_size=evaluated.first_failing if evaluated else None,
        eval_training_batch_size=evaluated.training_batch if evaluated else None,
        eval_stop_reason=evaluated.stop if evaluated else None,
        prediction=views.prediction,
        accumulation=views.accumulation,
        allocator_comparison=views.allocator_comparison,
        stop_reason=answer.stop,
        message=message,
        suggestions=suggestions,
        distributed=setting.distributed,
        data=setting.data,
        tokens=views.tokens,
        trials=views.trials,
        total_seconds=total_seconds,
    )
