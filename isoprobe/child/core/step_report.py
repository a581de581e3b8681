"""After each training step: report it (``StepDone``: its time and the memory readings) and say whether to stop.

One place for every loop a trial runs: isoprobe's own ``Step`` (``child.core.trial``)
and a framework's own loop (``child.framework.runners``: Lightning's ``fit``, the
Hugging Face ``Trainer``'s ``train``), so the parent classifies, checks and
judges steadiness from the same events whichever loop ran. A loop calls
``begin`` before a step and ``after_step`` when the optimizer has stepped;
``after_step`` is True when the trial has run enough: the request's steps, or,
with a steady rule, steady or at the rule's cap (every rank agreeing, in a gang).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from isoprobe.child.core.heap_churn import heap_churn
from isoprobe.child.core.memory import budget_peak, cpu_memory, data_cap
from isoprobe.protocol.messages import StepDone, TrialRequest
from isoprobe.report import steady
from isoprobe.system.proc_memory import shared_writable_bytes

if TYPE_CHECKING:
    from isoprobe.child.events import Events


@dataclass
class Progress:
    """How far the trial got: reported with the verdict, whatever the verdict is."""

    phase: str = "started"
    step_seconds: list[float] = field(default_factory=list)


class StepHook:
    """Times, reports and counts the steps of one trial (see the module's docstring)."""

    def __init__(
        self,
        torch: Any,
        device: Any,
        request: TrialRequest,
        events: Events,
        progress: Progress,
        can_extend: bool = False,
    ):
        """``can_extend``: the loop runs as many steps as ``after_step`` asks (isoprobe's own); a framework's stops
        at its ``max_steps`` whatever this says, so a cap lowered after a step keeps the peaks read under it."""
        self.torch, self.device, self.request, self.events, self.progress = torch, device, request, events, progress
        self.can_extend = can_extend
        self.peaks: list[int] = []  # the steps' readings since the cap was last lowered (child.core.cuda.refit_cap)
        self.churns: list[int | None] = []  # each step's heap churn (CPU): a quiet heap's window is shorter
        self.lowered_at = 0  # the step after which the cap was last lowered (0: never)
        self._started: float | None = None

    @property
    def steps_done(self) -> int:
        return len(self.progress.step_seconds)

    @property
    def most_steps(self) -> int:
        """The most steps this trial can run: what a framework's ``max_steps`` is set to."""
        rule = self.request.steady
        asked = self.request.steps or self.request.spec.search.steps
        return max(asked, rule.max_steps) if rule is not None else asked

    def begin(self) -> None:
        self._started = time.perf_counter()

    def after_step(self) -> bool:
        """Report the step that just ended; True when the trial should stop stepping."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        started = self._started if self._started is not None else time.perf_counter()
        self._started = None
        self.progress.step_seconds.append(time.perf_counter() - started)
        index = self.steps_done
        self.progress.phase = f"step {index}"
        memory = step_memory(self.torch, self.device)
        lowered = self._lower_the_cap()
        self.events.emit(StepDone(step=index, seconds=self.progress.step_seconds[-1], cap_lowered=lowered, **memory))
        if lowered:  # the readings so far were taken under a cap too loose: they restart with the next step
            self.peaks, self.churns, self.lowered_at = [], [], index
        else:
            self.peaks.append(memory["budget_peak_bytes"] or memory["peak_bytes"] or 0)
            self.churns.append(memory.get("heap_churn_bytes"))
        rule = self.request.steady
        if rule is None:
            return index >= (self.request.steps or self.request.spec.search.steps) and not lowered
        stop = not lowered and (index >= rule.max_steps + 1 or steady.should_stop(self.peaks, rule, self.churns))
        return gang_agrees(self.torch, self.device, self.request, stop)

    def _lower_the_cap(self) -> bool:
        """CUDA under a budget: the cap lowered by what came outside the allocator in this step (``child.core.cuda``),
        with the peaks restarted where the loop can step again. True only then: a framework's loop keeps its
        readings (a reading above the budget stays its verdict)."""
        if self.device.type != "cuda":
            return False
        from isoprobe.child.core import cuda as child_cuda

        lowered = child_cuda.refit_cap(self.torch, self.device, reset_peaks=self.can_extend)
        return lowered and self.can_extend


def step_memory(torch: Any, device: Any) -> dict[str, int | None]:
    """The peak so far and the memory held now, after a step: growth over the steps shows in them."""
    if device.type == "cuda":  # the budget's units, the same reading as the verdict's and a command's
        from isoprobe.child.cuda_readings import step_readings

        return step_readings(torch.cuda, device)
    memory = cpu_memory()
    readings = {
        "peak_bytes": memory.peak_rss,
        "held_bytes": memory.rss,
        "budget_peak_bytes": budget_peak(memory.peak_data, data_cap(), shared_writable_bytes()),
    }
    return readings | {"heap_churn_bytes": heap_churn()}  # read last: its few KiB of buffer are in no peak above


def gang_agrees(torch: Any, device: Any, request: TrialRequest, mine: bool) -> bool:
    """True when every rank says True (one process: its own answer). The ranks must step together, so a
    steady rule ends them at the same step: a gang's steady state is every rank's."""
    if request.rank is None:
        return mine
    import torch.distributed as dist

    flag = torch.tensor([0 if mine else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) == 0
