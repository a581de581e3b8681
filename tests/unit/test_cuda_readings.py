"""issue 45: the CUDA readings and the budget's one meaning, on the fake device of tests/support/fake_cuda.py.

Each test names the defect it guards (the issue's numbering) and fails on the code before its fix: the budget
reading left out the memory outside the allocator (1, 4), took the reserved peak that the allocator's retries
drive to the cap (7), mixed units under cudaMallocAsync (10), read a card full with its cache held (9), missed
NCCL's out of memory (5) and a driver initialised by ``torch.cuda.is_available()`` (6).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from fake_cuda import (GiB, MiB, NCCL_OOM_MESSAGE, DistBackendError, FakeCard, FakeCuda,  # noqa: E402
                       OutOfMemoryError, fake_torch, segment_size)

from isoprobe.child.core import cuda as child_cuda  # noqa: E402
from isoprobe.child import request as child_request  # noqa: E402
from isoprobe.pipeline.plausibility import Asked, over_budget  # noqa: E402
from isoprobe.protocol.messages import TrialResult  # noqa: E402
from isoprobe.report import outcomes  # noqa: E402
from isoprobe.report.outcomes import Outcome, card_was_full, classify_exception  # noqa: E402
from isoprobe.report.trial import Sizes  # noqa: E402
from isoprobe.search.margin import clears, floor_bytes  # noqa: E402

DEVICE = "cuda:0"


def _trial_process(budget: int | None, card: FakeCard | None = None, backend: str = "native", warm_up: int = 120 * MiB,
                   **fake):
    """A trial's process after ``child.core.cuda.setup``: context, warm-up, fraction. The warm-up is the fake's."""
    cuda = FakeCuda(card or FakeCard(total=80 * GiB), context_bytes=480 * MiB, warm_up_bytes=warm_up, backend=backend,
                    **fake)
    torch = fake_torch(cuda)
    original = child_cuda.warm_up
    child_cuda.warm_up = lambda torch, device, precision: cuda.warm_up(device)
    try:
        child_cuda.setup(torch, DEVICE, "fp32", budget)
    finally:
        child_cuda.warm_up = original
    cuda.reset_peak_memory_stats(DEVICE)
    return cuda, torch


def _fill(cuda: FakeCuda, block: int) -> list:
    """Allocate ``block``-sized tensors until the allocator refuses one: the batch that just fits the cap."""
    blocks = []
    while True:
        try:
            blocks.append(cuda.allocate(block, DEVICE))
        except OutOfMemoryError:
            return blocks


# ----------------------------------------------------------------------------------------------- the fake itself


def test_the_fake_models_what_the_issue_names():
    cuda = FakeCuda(FakeCard(total=16 * GiB), context_bytes=500 * MiB)
    assert not cuda.is_initialized()
    cuda.init()
    free, total = cuda.mem_get_info(DEVICE)
    assert total - free == 500 * MiB and cuda.memory_reserved(DEVICE) == 0  # the context lies outside the allocator
    assert [segment_size(n) for n in (4096, 3 * MiB, 11 * MiB)] == [2 * MiB, 20 * MiB, 12 * MiB]
    cuda.set_per_process_memory_fraction(0.25, DEVICE)
    blocks = _fill(cuda, 100 * MiB)
    assert cuda.memory_reserved(DEVICE) <= 4 * GiB < cuda.memory_reserved(DEVICE) + 100 * MiB  # the cap: reserved
    for block in blocks[::2]:
        cuda.free(block, DEVICE)
    retries = cuda.memory_stats(DEVICE)["num_alloc_retries"]  # the refused one retried too
    cuda.allocate(150 * MiB, DEVICE)  # no cached block is big enough: the cache is freed and the request retried
    assert cuda.memory_stats(DEVICE)["num_alloc_retries"] == retries + 1
    cuda.load(64 * MiB, "NCCL")
    assert cuda.mem_get_info(DEVICE)[1] - cuda.mem_get_info(DEVICE)[0] == 564 * MiB + cuda.memory_reserved(DEVICE)
    with pytest.raises(AttributeError):
        cuda.caching_allocator_alloc(1)  # what isoprobe does not call is not modelled
    two = FakeCuda(FakeCard(), FakeCard())
    two.init()
    assert two.memory_reserved(1) == 0 and two.memory_stats(1) == {} and not two.devices[1].initialised
    two.mem_get_info(1)
    assert two.devices[1].initialised  # cudaMemGetInfo makes a context on the device it asks about


# ----------------------------------------------------------------------------------------------------- defects


def test_1_a_batch_that_fills_its_budget_reads_as_filling_it_context_included():
    """The allocator is capped at the budget less the memory outside it: its reserved peak alone never came within
    300-600 MiB of the budget, so no batch was ever marginal under a budget."""
    budget = 16 * GiB
    cuda, torch = _trial_process(budget, lazy_kernel_bytes=0)  # nothing outside the allocator after the warm-up
    _fill(cuda, 50 * MiB)
    reading = child_cuda.readings(torch, DEVICE, Sizes())["budget_peak_bytes"]
    floor = floor_bytes("cuda", budget)
    assert budget - reading < 50 * MiB + segment_size(50 * MiB)  # within a block of the budget: it is full
    assert not clears(reading, budget, floor)  # so the margin rule calls it marginal
    assert reading <= budget  # and never above what the fraction allowed


def test_1_without_a_budget_the_reading_is_the_cards_whole_use():
    card = FakeCard(total=24 * GiB, others=2 * GiB)
    cuda, torch = _trial_process(None, card)
    _fill(cuda, 200 * MiB)
    reading = child_cuda.readings(torch, DEVICE, Sizes())["budget_peak_bytes"]
    free, total = cuda.mem_get_info(DEVICE)
    assert reading == total - free  # everything in use at the peak: the capacity (the card's total) less it is free


def test_4_memory_outside_the_allocator_that_loads_after_the_warm_up_is_counted_and_judged():
    budget = 8 * GiB
    cuda, torch = _trial_process(budget)
    blocks = _fill(cuda, 64 * MiB)
    for block in blocks[-6:]:  # the step ends: its activations go back to the cache
        cuda.free(block, DEVICE)
    cuda.load(300 * MiB, "kernels loaded lazily at the first backward")  # the card has room: no allocation fails
    step = child_cuda.step_readings(torch.cuda, DEVICE)
    final = child_cuda.readings(torch, DEVICE, Sizes(), step["budget_peak_bytes"])
    assert step["budget_peak_bytes"] > budget and final["budget_peak_bytes"] >= step["budget_peak_bytes"]
    result = TrialResult(outcome=Outcome.FITS, phase="done", step_seconds=[0.1], **final)
    reason = over_budget(result, Asked(steps=1, backend="cuda", budget_bytes=budget))
    assert reason is not None and "outside the allocator" in reason  # out of memory, never 'fits'


def test_7_the_reading_does_not_move_with_the_allocators_retries():
    """Near the cap the allocator frees its cache and retries: the reserved peak reaches the cap for a batch that
    needs far less. The margin's reading is the need (allocated plus the free space inside used segments)."""
    budget = 4 * GiB
    cuda, torch = _trial_process(budget)
    first = [cuda.allocate(30 * MiB, DEVICE) for _ in range(80)]  # one step's activations: 2400 MiB
    for block in first:
        cuda.free(block, DEVICE)  # back in the cache, in 30 MiB segments
    second = [cuda.allocate(32 * MiB, DEVICE) for _ in range(40)]  # the next step's: 32 MiB fits no cached segment
    readings = child_cuda.readings(torch, DEVICE, Sizes())
    cap = int(cuda.get_per_process_memory_fraction(DEVICE) * 80 * GiB)
    outside = readings["sizes"].cuda_context_bytes
    floor = floor_bytes("cuda", budget)
    assert readings["alloc_retries"] >= 1
    assert readings["peak_bytes"] > cap - 32 * MiB  # the reserved peak reads the cap ...
    assert not clears(readings["peak_bytes"] + outside, budget, floor)  # ... which would call the batch marginal
    assert readings["budget_peak_bytes"] - outside == 80 * 30 * MiB  # the need reads the batch's largest step
    assert clears(readings["budget_peak_bytes"], budget, floor)
    assert len(second) == 40


def test_7_the_need_counts_the_free_space_left_inside_used_segments():
    cuda, torch = _trial_process(None)
    blocks = [cuda.allocate(3 * MiB, DEVICE) for _ in range(6)]  # 20 MiB segments, 6 MiB of each free
    for block in blocks[1::2]:
        cuda.free(block, DEVICE)
    stats = cuda.memory_stats(DEVICE)
    need = child_cuda.allocator_need(cuda.max_memory_reserved(DEVICE), cuda.max_memory_allocated(DEVICE),
                                     stats["inactive_split_bytes.all.peak"], asynchronous=False)
    assert cuda.max_memory_allocated(DEVICE) < need <= cuda.max_memory_reserved(DEVICE)


def test_10_steps_and_verdict_read_the_same_units_under_cuda_malloc_async():
    budget = 8 * GiB
    cuda, torch = _trial_process(budget, backend="cudaMallocAsync")
    blocks = [cuda.allocate(256 * MiB, DEVICE) for _ in range(8)]
    for block in blocks:
        cuda.free(block, DEVICE)  # back in the pool: reserved stays at the high-water mark
    cuda.allocate(128 * MiB, DEVICE)
    step = child_cuda.step_readings(torch.cuda, DEVICE)
    final = child_cuda.readings(torch, DEVICE, Sizes())
    assert step["budget_peak_bytes"] == final["budget_peak_bytes"]
    assert final["budget_peak_bytes"] == cuda.max_memory_allocated(DEVICE) + final["sizes"].cuda_context_bytes


def test_9_a_card_whose_cache_fills_it_is_not_full_for_a_library():
    """A cuDNN 'unable to find an engine' at a large batch without a budget: the allocator's cache holds most of the
    card, the tensors in use do not. A library asking the allocator would have had the cache."""
    cuda, torch = _trial_process(None, FakeCard(total=24 * GiB))
    blocks = _fill(cuda, 256 * MiB)
    for block in blocks[: len(blocks) // 2]:
        cuda.free(block, DEVICE)
    memory = child_cuda.memory_at_failure(torch, DEVICE)
    assert card_was_full(memory["free_bytes"], memory["total_bytes"])  # the card alone looks full ...
    free = outcomes.free_at_failure(memory["free_bytes"], memory["reserved_bytes"], memory["allocated_bytes"])
    assert not card_was_full(free, memory["total_bytes"])  # ... but half of it was the allocator's to give


def test_9_a_card_full_of_tensors_is_full():
    cuda, torch = _trial_process(None, FakeCard(total=24 * GiB))
    _fill(cuda, 256 * MiB)
    memory = child_cuda.memory_at_failure(torch, DEVICE)
    assert card_was_full(outcomes.free_at_failure(memory["free_bytes"], memory["reserved_bytes"], memory["allocated_bytes"]),
                         memory["total_bytes"])


def test_5_ncclS_out_of_memory_is_out_of_memory():
    names = [cls.__name__ for cls in DistBackendError.__mro__]
    assert names[:3] == ["DistBackendError", "DistError", "RuntimeError"]  # as torch.distributed defines them
    assert classify_exception(names, NCCL_OOM_MESSAGE) is Outcome.OUT_OF_MEMORY
    other = NCCL_OOM_MESSAGE.replace("Cuda failure 2 'out of memory'", "Cuda failure 700 'an illegal memory access'")
    assert classify_exception(names, other) is Outcome.ERROR  # NCCL's other CUDA failures are not memory


def test_6_a_driver_initialised_by_is_available_is_seen(tmp_path, monkeypatch):
    """``torch.cuda.is_available()`` runs cuInit without ``is_initialized()`` saying so: a fork server whose preload
    called it must not fork trials."""
    maps = tmp_path / "maps"
    maps.write_text("7f0000000000-7f0000100000 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54\n")
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    cuda.is_available()
    assert not cuda.is_initialized() and cuda.driver_initialised  # what torch says, and what happened
    assert child_request.driver_initialised(str(maps))
    maps.write_text("7f0000000000-7f0000100000 r-xp 00000000 08:01 43 /opt/torch/lib/libcudart.so.13\n")
    assert not child_request.driver_initialised(str(maps))


def test_1_the_capacity_a_reading_is_compared_with_is_the_budget_or_the_whole_card():
    """A reading counts the whole card's use, context included: the capacity it is compared with is the budget (or
    the card's total), never the environment check's free memory, which had one context taken out already."""
    from isoprobe.pipeline.environment import Target
    from isoprobe.report.device import DeviceInfo

    for budget in (16 * GiB, None):
        info = DeviceInfo(backend="cuda", requested="cuda", name="NVIDIA H100", index=0, total_memory_bytes=80 * GiB,
                          memory_budget_bytes=budget, budget_source="spec" if budget else None,
                          capacity_bytes=budget or 80 * GiB)
        target = Target("cuda", "cuda:0", info, free_bytes=80 * GiB - 520 * MiB)
        assert target.search_capacity == (budget or 80 * GiB)


def test_2_a_command_trial_carries_the_checks_outside_memory_to_its_shim():
    """The command's shim caps the allocator at CUDA's initialisation, before the command's first step has measured
    the memory outside it: the environment check's figure (its context, other processes) is taken off first."""
    from pathlib import Path as _Path

    from isoprobe.child.command_trial.start import request_environment
    from isoprobe.pipeline.environment import Target
    from isoprobe.protocol.wiring import SHIM_CUDA_OUTSIDE_ENV
    from isoprobe.protocol.messages import TrialRequest
    from isoprobe.spec.model import Spec
    from isoprobe.report.device import DeviceInfo

    info = DeviceInfo(backend="cuda", requested="cuda", name="NVIDIA H100", index=0, total_memory_bytes=80 * GiB,
                      memory_budget_bytes=8 * GiB, budget_source="spec", capacity_bytes=8 * GiB)
    assert Target("cuda", "cuda:0", info, free_bytes=80 * GiB - 520 * MiB).cuda_outside_bytes == 520 * MiB
    assert Target("cuda", "cuda:0", info, free_bytes=None).cuda_outside_bytes is None
    spec = Spec.model_validate({"command": ["python", "train.py", "{batch_size}"], "device": "cuda"})
    request = TrialRequest(spec=spec, batch_size=4, device="cuda:0", memory_budget_bytes=8 * GiB,
                           cuda_outside_bytes=520 * MiB)
    assert request_environment(request, _Path("/tmp"))[SHIM_CUDA_OUTSIDE_ENV] == str(520 * MiB)
