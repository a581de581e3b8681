"""issue 20, defect 3: under fp16's GradScaler a trial keeps stepping until Adam really stepped, and never
reports 'fits' without its state. Real torch on the CPU: GradScaler('cpu') skips steps as on CUDA."""

from __future__ import annotations

import types

import pytest

from isoprobe.child.core.optimizer_state import OptimizerNeverStepped, RealSteps
from isoprobe.report.trial import Sizes

torch = pytest.importorskip("torch")


class _Step:
    """training.Step's parts that RealSteps reads: a linear model, Adam, a scaler, the breakdown."""

    def __init__(self, first_real_scale: float, scaler: bool = True):
        self.model = torch.nn.Linear(8, 4)
        self.optimizer = torch.optim.Adam(self.model.parameters())
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16) if scaler else None
        self.user_step = None
        self.sizes: Sizes | None = None
        #: Every gradient is 2 * factor * scale (a batch of 2 ones, the outputs summed): with this factor it
        #: reaches 2**128, infinite in fp32, at every scale above ``first_real_scale``, which steps for real.
        self.factor = 2.0**127 / (2 * first_real_scale)
        self.runs = 0

    def run(self) -> None:
        self.runs += 1
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model(torch.ones(2, 8)).sum() * self.factor
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        if self.sizes is None:
            self.sizes = self._measure_sizes()

    def _measure_sizes(self) -> Sizes:
        state = sum(v.numel() * v.element_size() for s in self.optimizer.state.values() for v in s.values()
                    if isinstance(v, torch.Tensor) and v.dim() > 0)
        return Sizes(optimizer_state_bytes=state)


def _trial(step: _Step, asked: int) -> int:
    """The trial's loop as child.core.trial runs it: the asked steps, then settle; returns the extra steps."""
    done = []
    real = RealSteps(step, lambda: len(done) + 1)
    for _ in range(asked):
        step.run()
        done.append(1)
    return real.settle(step.run, len(done))


def test_a_scaler_that_skipped_every_asked_step_makes_the_trial_step_on_until_adam_holds_its_state():
    step = _Step(first_real_scale=2.0**11)  # scales 2**16 .. 2**12 overflow: five skips, then a real step
    extra = _trial(step, asked=3)
    # Two more skips (2**13, 2**12 after three asked), the real step at 2**11, and one full step with the state held.
    assert extra == 4 and step.runs == 7
    assert len(step.optimizer.state) == 2  # weight and bias: exp_avg and exp_avg_sq exist
    assert step.sizes.optimizer_state_bytes == 2 * 4 * (8 * 4 + 4)  # measured again, no longer 0


def test_the_first_real_step_in_the_last_asked_step_gets_one_full_step_after_it():
    step = _Step(first_real_scale=2.0**14)  # 2**16 and 2**15 skip, 2**14 steps: the third asked step
    assert _trial(step, asked=3) == 1


def test_a_scaler_that_steps_at_once_adds_nothing():
    step = _Step(first_real_scale=2.0**20)
    assert _trial(step, asked=3) == 0 and step.runs == 3
    assert step.sizes.optimizer_state_bytes > 0


def test_an_optimizer_that_never_steps_is_an_error_never_a_fit():
    step = _Step(first_real_scale=2.0**-40)  # overflows at every scale the bound reaches
    with pytest.raises(OptimizerNeverStepped, match="skipped all 27 optimizer steps"):
        _trial(step, asked=3)
    assert len(step.optimizer.state) == 0
    from isoprobe.report.outcomes import Outcome, classify_exception

    names = [c.__name__ for c in OptimizerNeverStepped.__mro__]
    assert classify_exception(names, "fp16 mixed precision: the gradient scaler skipped") is Outcome.ERROR


def test_without_a_scaler_or_with_the_users_own_step_nothing_is_counted():
    assert _trial(_Step(first_real_scale=2.0**-40, scaler=False), asked=2) == 0
    user = types.SimpleNamespace(scaler=object(), user_step=lambda *a: None, optimizer=None)
    assert RealSteps(user, lambda: 1).settle(lambda: None, 3) == 0
