"""issue 20, defect 4 and the cudaMallocAsync note: the budget's arithmetic and the readings, with a fake
``torch.cuda`` (what each torch call returns is stated; the arithmetic is isoprobe's)."""

from __future__ import annotations

import types

import pytest

from isoprobe.child.core import cuda as child_cuda
from isoprobe.report.trial import Sizes

GiB = 1024**3
MiB = 1024**2


def test_the_fraction_leaves_room_for_what_lies_outside_the_allocator():
    # An 80 GiB card emulating 16 GiB: the context and libraries (600 MiB) take part of the 16 GiB.
    fraction = child_cuda.budget_fraction(16 * GiB, 80 * GiB, 600 * MiB)
    assert fraction == pytest.approx((16 * GiB - 600 * MiB) / (80 * GiB))
    assert fraction * 80 * GiB + 600 * MiB == pytest.approx(16 * GiB)  # allocator plus outside: the budget


def test_the_fraction_is_clamped():
    assert child_cuda.budget_fraction(100 * GiB, 80 * GiB, 0) == 1.0
    assert child_cuda.budget_fraction(500 * MiB, 80 * GiB, 600 * MiB) == 0.0  # nothing left: every allocation fails
    with pytest.raises(ValueError):
        child_cuda.budget_fraction(GiB, 0, 0)


def test_outside_the_allocator_is_what_is_used_but_not_reserved():
    assert child_cuda.outside_allocator_bytes(free_bytes=70 * GiB, total_bytes=80 * GiB,
                                              reserved_bytes=9 * GiB) == GiB
    assert child_cuda.outside_allocator_bytes(free_bytes=80 * GiB, total_bytes=80 * GiB, reserved_bytes=GiB) == 0


class _FakeCuda:
    """torch.cuda as one trial's process sees it: 80 GiB card, 500 MiB context after the warm-up."""

    def __init__(self, backend: str = "native"):
        self.calls: list[tuple] = []
        self.reserved = 20 * MiB
        self.backend = backend
        self.memory = types.SimpleNamespace(get_allocator_backend=lambda: self.backend)

    def init(self):
        self.calls.append(("init",))

    def set_device(self, device):
        self.calls.append(("set_device", device))

    def mem_get_info(self, device):
        return 80 * GiB - 500 * MiB - self.reserved, 80 * GiB

    def memory_reserved(self, device):
        return self.reserved

    def set_per_process_memory_fraction(self, fraction, device):
        self.calls.append(("fraction", fraction))

    def max_memory_reserved(self, device):
        return 6 * GiB

    def max_memory_allocated(self, device):
        return 5 * GiB

    def memory_allocated(self, device):
        return GiB


def test_setup_initialises_first_warms_up_then_sets_the_fraction_from_the_measured_outside(monkeypatch):
    cuda = _FakeCuda()
    torch = types.SimpleNamespace(cuda=cuda)
    order = []
    monkeypatch.setattr(child_cuda, "warm_up", lambda torch, device, precision: order.append(("warm_up", precision)))
    report = child_cuda.setup(torch, "cuda:0", "fp16-mixed", 16 * GiB)
    assert cuda.calls[0] == ("init",) and cuda.calls[1] == ("set_device", "cuda:0")
    assert order == [("warm_up", "fp16-mixed")]
    assert cuda.calls[-1] == ("fraction", pytest.approx((16 * GiB - 500 * MiB) / (80 * GiB)))
    assert report == {"total_memory_bytes": 80 * GiB}


def test_setup_without_a_budget_sets_no_fraction(monkeypatch):
    cuda = _FakeCuda()
    monkeypatch.setattr(child_cuda, "warm_up", lambda *args: None)
    child_cuda.setup(types.SimpleNamespace(cuda=cuda), "cuda:0", "fp32", None)
    assert not [c for c in cuda.calls if c[0] == "fraction"]


@pytest.mark.parametrize(("backend", "need"), [("native", 6 * GiB), ("cudaMallocAsync", 5 * GiB)])
def test_the_budget_peak_is_what_the_fraction_limits_plus_what_lies_outside_it(backend, need):
    # Native: the fraction caps reserved bytes (an allocator without statistics: its reserved peak stands for the
    # need). cudaMallocAsync: bytes in use; its reserved is the pool's high-water. Both plus the context (issue 45).
    readings = child_cuda.readings(types.SimpleNamespace(cuda=_FakeCuda(backend)), "cuda:0", Sizes())
    assert readings["budget_peak_bytes"] == need + 500 * MiB
    assert readings["peak_bytes"] == 6 * GiB and readings["peak_allocated_bytes"] == 5 * GiB
    assert readings["sizes"].cuda_context_bytes == 500 * MiB
    assert readings["sizes"].reserved_unallocated_bytes == GiB
    assert readings["base_bytes"] == GiB + 500 * MiB


def test_memory_at_failure_is_none_when_cuda_cannot_answer():
    def broken(device):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    cuda = _FakeCuda()
    cuda.mem_get_info = broken
    assert child_cuda.memory_at_failure(types.SimpleNamespace(cuda=cuda), "cuda:0") is None
    reading = child_cuda.memory_at_failure(types.SimpleNamespace(cuda=_FakeCuda()), "cuda:0")
    assert reading == {"free_bytes": 80 * GiB - 520 * MiB, "total_bytes": 80 * GiB, "reserved_bytes": 20 * MiB,
                       "allocated_bytes": GiB}
