"""fp16 mixed precision: make sure the optimizer really stepped, so its state is in the peak.

``GradScaler`` starts at a scale of 2**16 and *skips* ``optimizer.step()`` while the scaled
gradients overflow, halving the scale each time. A trial of three steps can skip all three:
Adam's ``exp_avg`` and ``exp_avg_sq`` (twice the weights) are then never allocated, the peak
lacks them and the maximum is overestimated. A real run skips a few steps and then trains with
that state held, so after the asked steps the trial keeps stepping (bounded) until the optimizer
has stepped and one full step ran with its state held. A trial whose optimizer never stepped
raises: it must not report "fits".

Whether the optimizer stepped is read from its own step hook (``register_step_post_hook``),
which runs only when ``optimizer.step()`` really runs: the scaler's skip never calls it.
"""

from __future__ import annotations

from collections.abc import Callable

#: Extra steps at most. Each skip halves the scale: after 24, 2**16 has become 2**-8, and
#: gradients that still overflow there are not a scale problem.
MAX_EXTRA_STEPS = 24


class OptimizerNeverStepped(RuntimeError):
    """Every step was skipped by the gradient scaler: the optimizer's state was never allocated."""


class RealSteps:
    """Counts the optimizer's real steps, and which trial step held the first one.

    ``step``: an object with ``scaler``, ``optimizer``, ``user_step`` and ``sizes`` (``training.Step``).
    ``current_step``: the number of the trial step running now (1-based), read when the hook fires.
    Does nothing where no built-in scaler is used (no fp16, inference, or the user's own step).
    """

    def __init__(self, step, current_step: Callable[[], int]):
        self.step = step
        self.count = 0
        self.first_at: int | None = None
        self.active = getattr(step, "scaler", None) is not None and getattr(step, "user_step", None) is None
        if self.active:
            step.optimizer.register_step_post_hook(self._stepped)
        self._current_step = current_step
        self._extra_run = 0  # extra steps finished: they add to current_step, which counts asked steps only

    def _stepped(self, optimizer, args, kwargs) -> None:
        self.count += 1
        if self.first_at is None:
            self.first_at = self._current_step() + self._extra_run

    def settle(self, run_one: Callable[[], None], done: int, limit: int = MAX_EXTRA_STEPS) -> int:
        """After ``done`` asked steps: step on until a full step ran with the state held; return the extra steps.

        Nothing to do when the optimizer stepped in a step that was followed by another, or in
        the first step (then it steps as an unscaled run does). Raises ``OptimizerNeverStepped``
        when ``limit`` extra steps still leave the optimizer without a real step.
        """
        if not self.active:
            return 0
        extra = 0
        while self.count == 0:
            if extra >= limit:
                raise OptimizerNeverStepped(
                    f"fp16 mixed precision: the gradient scaler skipped all {done + extra} optimizer steps "
                    f"(the gradients overflowed at every scale down to {self.step.scaler.get_scale():g}), so the "
                    "optimizer's state was never allocated and the peak would lack it; check the model's "
                    "numerics in fp16, or use bf16-mixed or fp32"
                )
            run_one()
            extra += 1
            self._extra_run = extra
        if self.first_at is not None and self.first_at > 1 and self.first_at >= done + extra:
            # The first real step was the last one run: one full step more, with the state held.
            run_one()
            extra += 1
            self._extra_run = extra
        sizes = getattr(self.step, "sizes", None)
        if sizes is not None and not sizes.optimizer_state_bytes:
            # The breakdown was measured after a skipped first step (no state yet): measure it again.
            self.step.sizes = self.step._measure_sizes()
        return extra
