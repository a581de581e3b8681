"""The CUDA budget as the first GPU run measured it (docs/gpu.md, H200, torch 2.11), on the fake device of
tests/support/fake_cuda.py.

1. **The cap follows what comes outside the allocator after it was set** (``child.core.cuda.refit_cap``). The model's
   kernels load lazily at their first use, after the warm-up that the cap was computed after: 2 MiB on the H200.
   Every batch whose allocator then reached the cap read 2 MiB over the budget and was called out of memory, where a
   card with only the budget free trained it (75 and 76; isoprobe said 74). Each test below failed on the code
   before the fix.
2. **A peak within the spread is tested, not read** (``child.core.cuda.squeeze``): near the cap the allocator frees its
   cache and retries, so its reading is the cap's; the steps run again under a cap the spread lower decide.
3. **The CUDA floor has no part that grows with the card**: 0.2 % was 286 MiB on the 140 GiB card, where fresh
   processes differed by 2 MiB, and ruled out 375 and 376, which a plain loop trained there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from fake_cuda import GiB, MiB, FakeCard, FakeCuda, fake_torch  # noqa: E402
from scripted_probe import hog_spec  # noqa: E402

from isoprobe.child.core import cuda as child_cuda  # noqa: E402
from isoprobe.child import cuda_readings  # noqa: E402
from isoprobe.child.core import step_report
from isoprobe.pipeline.plausibility import Asked, implausible  # noqa: E402
from isoprobe.protocol.messages import MemoryReading, ModelBuilt, StepDone, TrialRequest, TrialResult  # noqa: E402
from isoprobe.report.outcomes import Outcome  # noqa: E402
from isoprobe.search import margin  # noqa: E402
from isoprobe.spec.model import Spec  # noqa: E402

DEVICE = "cuda:0"
BUDGET = 8 * GiB
CONTEXT = 500 * MiB
#: The kernels the model's first allocation loads after the warm-up: what the H200 measured.
LATE_KERNELS = 2 * MiB
#: The allocator's room under the cap set after the warm-up (the context taken off the budget).
OLD_ROOM = BUDGET - CONTEXT
WEIGHTS = 10  # blocks of 100 MiB: the weights, gradients and optimizer state, held through the steps
#: Activations of a size that lands the reserved bytes exactly on the old cap before the allocator retries.
ACTIVATION = 204 * MiB
ACTIVATIONS = 32


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.setattr(cuda_readings, "_NVML", {}, raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(child_cuda, "_CAPS", {})


def _card(lazy: int = LATE_KERNELS):
    cuda = FakeCuda(FakeCard(total=80 * GiB), context_bytes=CONTEXT, lazy_kernel_bytes=lazy)
    torch = fake_torch(cuda)
    original = child_cuda.warm_up
    child_cuda.warm_up = lambda torch, device, precision: cuda.warm_up(device)
    try:
        child_cuda.setup(torch, DEVICE, "fp32", BUDGET)
    finally:
        child_cuda.warm_up = original
    child_cuda.start_counting(torch, DEVICE)
    weights = [cuda.allocate(100 * MiB, DEVICE) for _ in range(WEIGHTS)]
    return cuda, torch, weights


def _step(cuda: FakeCuda) -> None:
    """One step of a CNN as the caching allocator sees it: small tensors in 20 MiB segments (3 to a segment, 2 MiB
    left inside each), freed; then the large activations, which do not fit the small segments' cache: at the cap the
    allocator frees that cache and retries. The batch needs 1000 + 32 x 204 = 7528 MiB, under either cap."""
    small = [cuda.allocate(6 * MiB, DEVICE) for _ in range(300)]
    for block in small:
        cuda.free(block, DEVICE)
    large = [cuda.allocate(ACTIVATION, DEVICE) for _ in range(ACTIVATIONS)]
    for block in large:
        cuda.free(block, DEVICE)


def test_1_the_reading_under_the_cap_set_before_the_kernels_loaded_is_over_the_budget():
    """What the H200 showed: a batch that fits reads 2 MiB over the budget, because its kernels loaded after the cap."""
    cuda, _, _ = _card()
    _step(cuda)
    reading = cuda_readings.card_reading(cuda, DEVICE)
    assert reading["retries"] >= 1 and cuda.max_memory_reserved(DEVICE) == OLD_ROOM  # the cap, not the batch
    assert reading["outside"] == CONTEXT + LATE_KERNELS
    assert reading["budget_peak_bytes"] == BUDGET + LATE_KERNELS


def test_1_the_cap_is_lowered_after_the_step_and_the_next_step_reads_within_the_budget():
    cuda, torch, _ = _card()
    _step(cuda)
    assert child_cuda.refit_cap(torch, DEVICE, reset_peaks=True)
    assert cuda.calls[-1][:2] == ("fraction", (BUDGET - CONTEXT - LATE_KERNELS) / (80 * GiB))
    _step(cuda)
    reading = cuda_readings.card_reading(cuda, DEVICE)
    assert reading["budget_peak_bytes"] <= BUDGET
    assert not child_cuda.refit_cap(torch, DEVICE, reset_peaks=True)  # nothing more came: the cap stands


def test_1_a_loop_that_cannot_step_again_keeps_the_reading_taken_under_the_loose_cap():
    cuda, torch, _ = _card()
    _step(cuda)
    assert child_cuda.refit_cap(torch, DEVICE, reset_peaks=False)
    assert cuda_readings.card_reading(cuda, DEVICE)["budget_peak_bytes"] > BUDGET  # still its verdict: over


def test_1_without_a_budget_there_is_no_cap_to_follow():
    cuda = FakeCuda(FakeCard(total=80 * GiB), context_bytes=CONTEXT, lazy_kernel_bytes=LATE_KERNELS)
    torch = fake_torch(cuda)
    cuda.init()
    cuda.set_device(0)
    cuda.allocate(MiB, DEVICE)
    assert not child_cuda.refit_cap(torch, DEVICE, reset_peaks=True)


class _Events:
    def __init__(self):
        self.emitted = []

    def emit(self, event):
        self.emitted.append(event)


def _request(steps: int = 3) -> TrialRequest:
    spec = Spec.model_validate(hog_spec())
    return TrialRequest(spec=spec, batch_size=8, device=DEVICE, memory_budget_bytes=BUDGET, steps=steps)


class _Device:
    """``torch.device("cuda:0")`` as the hook and the cap's memo see it."""

    type = "cuda"
    index = 0

    def __str__(self) -> str:
        return DEVICE


def _hook(torch, request, can_extend=True):
    device = _Device()
    events = _Events()
    return step_report.StepHook(torch, device, request, events, step_report.Progress(), can_extend), events


def test_1_the_steps_hook_lowers_the_cap_says_so_and_restarts_the_peaks():
    cuda, torch, _ = _card()
    hook, events = _hook(torch, _request())
    stops = []
    for _ in range(3):
        hook.begin()
        _step(cuda)
        stops.append(hook.after_step())
    assert [e.cap_lowered for e in events.emitted] == [True, False, False]
    assert stops == [False, False, True] and len(hook.peaks) == 2  # step 1's reading is not the verdict's
    assert events.emitted[0].budget_peak_bytes > BUDGET >= max(hook.peaks)


def test_1_a_cap_lowered_after_the_last_step_asks_for_one_more():
    cuda, torch, _ = _card(lazy=0)
    hook, events = _hook(torch, _request(steps=1))
    hook.begin()
    _step(cuda)
    cuda.load(LATE_KERNELS, device=DEVICE)  # kernels that came in the last asked step
    assert not hook.after_step()
    hook.begin()
    _step(cuda)
    assert hook.after_step()
    assert [e.cap_lowered for e in events.emitted] == [True, False]


def test_1_a_frameworks_loop_keeps_its_readings_and_asks_for_nothing_more():
    cuda, torch, _ = _card()
    hook, events = _hook(torch, _request(steps=1), can_extend=False)
    hook.begin()
    _step(cuda)
    assert hook.after_step() and not events.emitted[0].cap_lowered
    assert max(hook.peaks) > BUDGET  # the verdict stays "over the budget": no step ran under the lowered cap


def _fits_after(steps: list[StepDone], asked: Asked) -> str | None:
    result = TrialResult(outcome=Outcome.FITS, phase="done", step_seconds=[s.seconds for s in steps],
                         peak_bytes=GiB, budget_peak_bytes=GiB)
    return implausible([ModelBuilt(memory=MemoryReading()), *steps, result], asked)


def test_1_a_step_the_cap_was_lowered_after_is_one_the_parent_accepts_beyond_the_asked_steps():
    asked = Asked(steps=3, backend="cuda", budget_bytes=BUDGET)
    plain = [StepDone(step=i, seconds=0.1) for i in range(1, 5)]
    assert "3 training steps were asked for" in _fits_after(plain, asked)
    lowered = [StepDone(step=i, seconds=0.1, cap_lowered=i == 3) for i in range(1, 5)]
    assert _fits_after(lowered, asked) is None


# ----------------------------------------------------------------------------------------------- 2. the squeeze


def test_2_a_batch_read_at_the_cap_that_fits_a_cap_the_spread_lower_reads_those_steps():
    cuda, torch, _ = _card(lazy=0)
    _step(cuda)
    assert cuda_readings.card_reading(cuda, DEVICE)["budget_peak_bytes"] == BUDGET  # the cap's reading: no margin
    check_at = BUDGET - margin.FLOOR_BYTES["cuda"]
    assert child_cuda.squeeze(torch, DEVICE, check_at, lambda: _step(cuda) or True)
    reading = cuda_readings.card_reading(cuda, DEVICE)
    assert reading["budget_peak_bytes"] <= check_at - child_cuda.GRANULE_BYTES
    assert margin.clears(reading["budget_peak_bytes"], BUDGET, margin.FLOOR_BYTES["cuda"])
    assert cuda.calls[-1][:2] == ("fraction", OLD_ROOM / (80 * GiB))  # the budget's cap put back


def test_2_a_batch_that_needs_the_spread_runs_out_under_the_squeeze_and_keeps_its_reading():
    cuda, torch, weights = _card(lazy=0)
    weights.append(cuda.allocate(140 * MiB, DEVICE))  # 7668 MiB needed: under the cap's 7692, not the squeeze's 7650
    _step(cuda)
    check_at = BUDGET - margin.FLOOR_BYTES["cuda"]
    assert not child_cuda.squeeze(torch, DEVICE, check_at, lambda: _step(cuda) or True)
    assert cuda.calls[-1][:2] == ("fraction", OLD_ROOM / (80 * GiB))


def test_2_steps_that_did_not_hold_still_under_the_squeeze_do_not_count():
    cuda, torch, _ = _card(lazy=0)
    _step(cuda)
    assert not child_cuda.squeeze(torch, DEVICE, BUDGET - 40 * MiB, lambda: _step(cuda) or False)


# ----------------------------------------------------------------------------------------------- 3. the floor


def test_3_the_cuda_floor_is_the_same_on_a_small_budget_and_a_whole_h200():
    assert margin.floor_bytes("cuda", 8 * GiB) == margin.floor_bytes("cuda", 140 * GiB) == 40 * MiB
    assert margin.floor_bytes("cpu", 80 * GiB) > margin.FLOOR_BYTES["cpu"]  # the CPU's still grows (measured)


class _Step:
    """``training.Step`` as the squeeze uses it: each run is one ``_step`` on the fake card."""

    def __init__(self, cuda):
        self.cuda, self.runs, self.batches = cuda, 0, 0

    def run(self, batch):
        self.runs += 1
        _step(self.cuda)

    def batch(self, size, indices):
        self.batches += 1
        return object()


def test_2_the_child_squeezes_only_the_trial_asked_to_whose_reading_is_within_the_spread():
    """``TrialRequest.margin_check_bytes`` reaches the child's loop (``child.core.trial._squeeze``): asked, and read at
    the cap, the trial runs its steps again under the squeezed cap and reads them; not asked, a gang's rank, or a
    reading that clears the line: no step more."""
    from isoprobe.child.core import trial as child_trial

    check_at = BUDGET - margin.FLOOR_BYTES["cuda"]
    asked = _request().model_copy(update={"margin_check_bytes": check_at})
    for request, peaks, squeezed in [
        (asked, [BUDGET], True),
        (_request(), [BUDGET], False),
        (asked.model_copy(update={"rank": None, "eval_batch_size": 4}), [BUDGET], False),
        (asked, [check_at - MiB], False),
    ]:
        cuda, torch, _ = _card(lazy=0)
        _step(cuda)
        step = _Step(cuda)
        batch, fit = child_trial._squeeze(request, torch, _Device(), step, object(), SimpleNamespace(peaks=peaks))
        assert fit is squeezed and step.runs == (child_trial.SQUEEZE_STEPS if squeezed else 0), request
        if squeezed:
            assert cuda_readings.card_reading(cuda, DEVICE)["budget_peak_bytes"] < check_at
