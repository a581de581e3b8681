"""Issue 57, item 3: the CUDA readings that under-read on a real card, each on the fake device of
tests/support/fake_cuda.py as torch behaves (c10's sources and the wheels' binaries; docs/how-it-works.md, CUDA
notes). Each test failed on the code before the fix.

1. expandable segments: the need is the mapped bytes' peak (``inactive_split`` leaves expandable blocks out);
2. torch before 2.10: the shim's cap creates no context on a device the process does not use, and leaves the current
   device as it was; torch before 2.6 (no ``get_per_process_memory_fraction``) is still capped;
3. a neighbour on the card: the memory outside the allocator is this process's own (NVML's per-process figure), and
   a card without the budget free is no parallel slot;
4. a library handle's creation never gets the allocator's cache back: a card full of cache is full for it;
5. retries count from the trial's start, not the process's.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from fake_cuda import GiB, MiB, FakeCard, FakeCuda, OutOfMemoryError, fake_pynvml, fake_torch  # noqa: E402
from lazy_fake_cuda import LazyFakeCuda  # noqa: E402

from isoprobe.child.core import cuda as child_cuda  # noqa: E402
from isoprobe.child import cuda_readings  # noqa: E402
from isoprobe.errors import SpecError  # noqa: E402
from isoprobe.pipeline import parallel  # noqa: E402
from isoprobe.protocol.command import SHIM_FOLDER  # noqa: E402
from isoprobe.report.outcomes import card_was_full, free_at_failure  # noqa: E402
from isoprobe.report.trial import Sizes  # noqa: E402

DEVICE = "cuda:0"
BUDGET = 8 * GiB


@pytest.fixture(autouse=True)
def no_nvml(monkeypatch):
    """No NVML unless a test installs the fake's; the readings' memo of NVML starts empty."""
    monkeypatch.setattr(cuda_readings, "_NVML", {}, raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


def _setup(cuda: FakeCuda, budget: int | None = BUDGET):
    torch = fake_torch(cuda)
    original = child_cuda.warm_up
    child_cuda.warm_up = lambda torch, device, precision: cuda.warm_up(device)
    try:
        child_cuda.setup(torch, DEVICE, "fp32", budget)
    finally:
        child_cuda.warm_up = original
    return torch


# ----------------------------------------------------------------------------------------------- 1. expandable


def test_1_under_expandable_segments_the_need_is_the_mapped_peak():
    """Expandable blocks never count in ``inactive_split``, but every mapped page counts against the cap: the need
    read as the allocated peak called a batch whose mapped pages filled the cap safe."""
    cuda = FakeCuda(FakeCard(total=80 * GiB), expandable=True, lazy_kernel_bytes=0)
    torch = _setup(cuda)
    child_cuda.start_counting(torch, DEVICE)
    blocks = [cuda.allocate(71 * MiB, DEVICE) for _ in range(61)]  # 4331 MiB: mapped in whole 20 MiB pages
    for block in blocks[1::2]:
        cuda.free(block, DEVICE)  # activations freed: their pages stay mapped (and counted) until a release
    stats = cuda.memory_stats(DEVICE)
    assert stats["inactive_split_bytes.all.peak"] == 0 and stats["segment.all.peak"] == 0
    reading = cuda_readings.card_reading(cuda, DEVICE)
    assert reading["need"] == cuda.max_memory_reserved(DEVICE) > cuda.max_memory_allocated(DEVICE)
    assert cuda_readings.expandable_segments(stats, environ={})  # seen in the statistics, without the setting
    assert cuda_readings.expandable_segments({}, environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert not cuda_readings.expandable_segments(
        {}, environ={"PYTORCH_ALLOC_CONF": "expandable_segments:True,expandable_segments:False"})


def test_1_without_expandable_segments_the_need_is_unchanged():
    cuda = FakeCuda(FakeCard(total=80 * GiB), lazy_kernel_bytes=0)
    _setup(cuda)
    for _ in range(10):
        cuda.allocate(30 * MiB, DEVICE)
    stats = cuda.memory_stats(DEVICE)
    reading = cuda_readings.card_reading(cuda, DEVICE)
    assert stats["segment.all.peak"] > 0 and not cuda_readings.expandable_segments(stats, environ={})
    assert reading["need"] == min(cuda.max_memory_reserved(DEVICE),
                                  cuda.max_memory_allocated(DEVICE) + stats["inactive_split_bytes.all.peak"])


def test_1_an_expandable_batch_filled_to_the_cap_reads_at_the_budget():
    cuda = FakeCuda(FakeCard(total=80 * GiB), expandable=True, lazy_kernel_bytes=0)
    torch = _setup(cuda)
    blocks = []
    with pytest.raises(OutOfMemoryError):
        while True:
            blocks.append(cuda.allocate(90 * MiB, DEVICE))
    reading = child_cuda.readings(torch, DEVICE, Sizes())["budget_peak_bytes"]
    assert BUDGET - reading < 110 * MiB  # the mapped pages reach the cap less one request's segment


# ----------------------------------------------------------------------------------------------- 2. the shim's cap


def _shim(monkeypatch, tmp_path, cuda, budget=BUDGET):
    spec = importlib.util.spec_from_file_location("_isoprobe_shim_first_call", SHIM_FOLDER / "_isoprobe_shim.py")
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    for loaded in ("_isoprobe_child_shim__isoprobe_cuda", "_isoprobe_child_cuda_readings"):
        monkeypatch.delitem(sys.modules, loaded, raising=False)
    monkeypatch.setenv(shim.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(shim.CUDA_BUDGET_ENV, str(budget))
    monkeypatch.setattr(sys, "addaudithook", lambda hook: None)
    shim._state["dir"] = str(tmp_path)
    (tmp_path / "gate").write_text("1000")
    torch = fake_torch(cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", cuda)
    hooks = types.SimpleNamespace(pre=[], post=[])
    shim._register(types.SimpleNamespace(register_optimizer_step_pre_hook=hooks.pre.append,
                                         register_optimizer_step_post_hook=hooks.post.append))
    return shim, hooks


def _lazy(version, cards=2):
    return LazyFakeCuda(*[FakeCard(total=80 * GiB) for _ in range(cards)], context_bytes=500 * MiB,
                        torch_version=version, lazy_kernel_bytes=0)


@pytest.mark.parametrize("version", ["2.5.1", "2.9.0"])
def test_2_before_torch_2_10_the_cap_waits_for_a_device_in_use_and_touches_no_other(monkeypatch, tmp_path, version):
    """A rank on cuda:1: capping every device at lazy initialisation made a context on cuda:0 too and left cuda:1
    current... or, before 2.6, raised on the missing getter and applied no cap at all."""
    cuda = _lazy(version)
    shim, hooks = _shim(monkeypatch, tmp_path, cuda)
    cuda.set_device(1)
    cuda.allocate(200 * MiB, "cuda:1")  # the rank's model: lazy initialisation runs here
    assert cuda.contexts() == [1] and cuda.devices[0].fraction == 1.0
    for hook in hooks.post:
        hook(None, (), {})
    assert cuda.devices[1].fraction < 0.1, "the device in use is capped after the first step"
    assert cuda.contexts() == [1], "no context on a device the process does not use"
    assert cuda.current_device() == 1
    assert hasattr(cuda, "get_per_process_memory_fraction") is (version >= "2.6")
    cuda.set_per_process_memory_fraction(0.5, 1)  # the script's own: half of the emulated card, the budget
    assert cuda.devices[1].fraction == pytest.approx(0.5 * BUDGET / (80 * GiB))
    assert cuda.contexts() == [1] and cuda.current_device() == 1


def test_2_from_torch_2_10_every_device_is_capped_at_initialisation_without_a_context(monkeypatch, tmp_path):
    cuda = _lazy("2.11.0")
    _shim(monkeypatch, tmp_path, cuda)
    cuda.allocate(200 * MiB, "cuda:1")
    assert cuda.devices[0].fraction == cuda.devices[1].fraction == pytest.approx(BUDGET / (80 * GiB))
    assert cuda.contexts() == [1]


def test_2_the_fake_learns_what_torch_2_9_does_when_a_fraction_is_set():
    cuda = FakeCuda(FakeCard(), FakeCard(), torch_version="2.9.0")
    cuda.set_per_process_memory_fraction(0.5, 1)
    assert cuda.devices[1].initialised and cuda.current_device() == 1  # SetDevice + cudaMemGetInfo
    new = FakeCuda(FakeCard(), FakeCard(), torch_version="2.10.0")
    new.set_per_process_memory_fraction(0.5, 1)
    assert not new.devices[1].initialised and new.current_device() == 0
    assert not hasattr(FakeCuda(torch_version="2.5.1"), "get_per_process_memory_fraction")


# ----------------------------------------------------------------------------------------------- 3. a neighbour


def test_3_a_neighbours_memory_is_not_taken_off_the_trials_budget(monkeypatch):
    """6 GiB of another process on the card: read card-wide, the outside memory was 6.6 GiB and the cap 1.4 GiB;
    by NVML's count for this pid it is the trial's own context and libraries."""
    card = FakeCard(total=80 * GiB, others=6 * GiB)
    cuda = FakeCuda(card, context_bytes=500 * MiB, warm_up_bytes=100 * MiB, lazy_kernel_bytes=0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(cuda))
    _setup(cuda)
    assert cuda.devices[0].fraction == pytest.approx((BUDGET - 600 * MiB) / (80 * GiB))
    assert cuda_readings.card_reading(cuda, DEVICE)["outside"] == 600 * MiB


def test_3_where_nvml_does_not_list_this_pid_the_card_wide_figure_stands(monkeypatch):
    card = FakeCard(total=80 * GiB, others=6 * GiB)
    cuda = FakeCuda(card, context_bytes=500 * MiB, warm_up_bytes=100 * MiB, lazy_kernel_bytes=0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(cuda, listed=False))  # a container's pid namespace
    _setup(cuda)
    assert cuda.devices[0].fraction == pytest.approx((BUDGET - 6 * GiB - 600 * MiB) / (80 * GiB))


def _target(free, budget):
    from isoprobe.pipeline.environment import Target
    from isoprobe.report.device import DeviceInfo

    info = DeviceInfo(backend="cuda", requested="cuda", name="H200", index=0, total_memory_bytes=140 * GiB,
                      memory_budget_bytes=budget, budget_source="spec" if budget else None,
                      capacity_bytes=budget or 140 * GiB)
    return Target("cuda", "cuda:0", info, free)


def test_3_a_card_without_the_budget_free_is_no_parallel_slot():
    """The target and its slot each have 5 GiB free under an 8 GiB budget: admitted before (the slots matched the
    target), though a trial there runs out of memory below the budget it emulates."""
    gpus = [{"name": "H200", "total_memory_bytes": 140 * GiB, "free_memory_bytes": 5 * GiB}] * 2
    with pytest.raises(SpecError) as raised:
        parallel.cuda_slots(2, _target(5 * GiB, BUDGET), gpus)
    assert "cuda:0 has 5.00 GiB free" in raised.value.problems[0].message
    assert "(the budget is 8.00 GiB)" in raised.value.problems[0].message
    roomy = [{"name": "H200", "total_memory_bytes": 140 * GiB, "free_memory_bytes": 100 * GiB}] * 2
    assert parallel.cuda_slots(2, _target(100 * GiB, BUDGET), roomy) == ["cuda:0", "cuda:1"]


def test_3_the_shims_first_outside_figure_is_the_checks_own_where_nvml_gives_it():
    target = _target(60 * GiB, BUDGET)
    assert target.cuda_outside_bytes == 80 * GiB  # card-wide: the neighbours' 79.5 GiB in it
    from dataclasses import replace

    assert replace(target, own_outside_bytes=520 * MiB).cuda_outside_bytes == 520 * MiB


# ----------------------------------------------------------------------------------------------- 4. handles


def test_4_a_handle_that_cannot_be_created_on_a_card_full_of_cache_is_an_allocation_failure():
    cuda = FakeCuda(FakeCard(total=24 * GiB), context_bytes=500 * MiB, lazy_kernel_bytes=0)
    torch = fake_torch(cuda)
    blocks = []
    with pytest.raises(OutOfMemoryError):
        while True:
            blocks.append(cuda.allocate(256 * MiB, DEVICE))
    for block in blocks:
        cuda.free(block, DEVICE)  # all cache now: reserved, not allocated
    with pytest.raises(RuntimeError) as raised:
        cuda.create_handle(64 * MiB)  # cublasCreate: from the driver, the cache not given back
    memory = child_cuda.memory_at_failure(torch, DEVICE)
    message = str(raised.value)
    free = free_at_failure(memory["free_bytes"], memory["reserved_bytes"], memory["allocated_bytes"], message)
    assert card_was_full(free, memory["total_bytes"])
    engine = free_at_failure(memory["free_bytes"], memory["reserved_bytes"], memory["allocated_bytes"],
                             "Unable to find an engine to execute this computation")
    assert not card_was_full(engine, memory["total_bytes"])  # a workspace asks the allocator, which gives it back


# ----------------------------------------------------------------------------------------------- 5. retries


def test_5_retries_while_the_model_was_built_are_not_the_batchs():
    cuda = FakeCuda(FakeCard(total=24 * GiB), lazy_kernel_bytes=0)
    torch = _setup(cuda, budget=4 * GiB)
    built = [cuda.allocate(300 * MiB, DEVICE) for _ in range(8)]
    for block in built[2:]:
        cuda.free(block, DEVICE)
    cuda.allocate(2 * GiB, DEVICE)  # the cache freed and retried while building
    assert cuda.memory_stats(DEVICE)["num_alloc_retries"] == 1
    child_cuda.start_counting(torch, DEVICE)
    cuda.allocate(100 * MiB, DEVICE)  # the batch: no retry
    assert child_cuda.readings(torch, DEVICE, Sizes())["alloc_retries"] == 0
    cuda.reset_peak_memory_stats(DEVICE)
    assert cuda.memory_stats(DEVICE)["num_alloc_retries"] == 0


def test_5_a_commands_retries_count_from_its_first_training_forward(monkeypatch, tmp_path):
    cuda = _lazy("2.11.0", cards=1)
    shim, hooks = _shim(monkeypatch, tmp_path, cuda)
    built = [cuda.allocate(1 * GiB, DEVICE) for _ in range(6)]
    for block in built[1:]:
        cuda.free(block, DEVICE)
    with pytest.raises(OutOfMemoryError):
        cuda.allocate(20 * GiB, DEVICE)  # the script's set-up hit the cap once and retried
    before = cuda.memory_stats(DEVICE)["num_alloc_retries"]
    assert before >= 1
    shim._forward_mark("began")
    for hook in hooks.post:
        hook(None, (), {})
    [line] = [line for line in shim_lines(tmp_path) if line.get("kind") == "step"]
    assert line["alloc_retries"] == 0


def shim_lines(folder: Path) -> list[dict]:
    import json

    [file] = folder.glob("p*.jsonl")
    return [json.loads(text) for text in file.read_text().splitlines() if text.strip()]
