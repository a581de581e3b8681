"""``FakeCuda`` with torch's lazy initialisation, which a command's shim relies on and isoprobe's own trials do not.

What it adds: CUDA's lazy initialisation with its queued calls (``torch.cuda._lazy_call``, run by ``_lazy_init`` after
``torch._C._cuda_init()`` and before any allocation), ``is_initialized`` meaning that initialisation (not a context),
the allocator's statistics read without a context (``THCPModule_memoryStats`` reads the allocator's counters; torch
returns {} before initialisation), and, from torch 2.10, the native allocator's ``set_per_process_memory_fraction``
creating no context (``setMemoryFraction`` caps against ``device_prop.totalGlobalMem``), where cudaMallocAsync's
does (``CUDAGuard``, ``cudaMemGetInfo``) and torch before 2.10 does too (``FakeCuda``'s per-version behaviour).
"""

from __future__ import annotations

from fake_cuda import FakeCuda


class LazyFakeCuda(FakeCuda):
    """``FakeCuda`` with torch's lazy initialisation and the context-free reads of a real torch.cuda (see above)."""

    def __init__(self, *cards, **kwargs):
        super().__init__(*cards, **kwargs)
        self.lazy_done = False
        self.queued: list = []

    def _lazy_call(self, callable_) -> None:
        if self.lazy_done:
            callable_()
        else:
            self.queued.append(callable_)

    def _lazy_init(self) -> None:
        if self.lazy_done:
            return
        self.lazy_done = True  # torch sets _tls.is_initializing: a queued call's own _lazy_init returns at once
        self.calls.append(("lazy_init",))
        for queued in self.queued:
            queued()

    def is_initialized(self) -> bool:
        return self.lazy_done

    def _device(self, device):
        self._lazy_init()
        return super()._device(device)

    def init(self) -> None:
        self._lazy_init()
        super().init()

    def current_device(self) -> int:
        self._lazy_init()
        return self.current

    def get_device_properties(self, device=None):
        self._lazy_init()
        return super().get_device_properties(device)

    def _set_fraction(self, fraction, device=None) -> None:
        self._lazy_init()
        if self.backend != "native" or self._version() < (2, 10):
            return FakeCuda._set_fraction(self, fraction, device)
        if not isinstance(fraction, float) or not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        index = self._index(device)
        self.devices[index].fraction = fraction
        self.calls.append(("fraction", fraction, index))

    def _get_fraction(self, device=None) -> float:
        self._lazy_init()
        return FakeCuda._get_fraction(self, device)

    def _stats_only(self, device):
        """The allocator's own counters: no context (a device never used reads zero)."""
        if not self.lazy_done:
            return None
        state = self.devices[self._index(device)]
        if self.backend != "native" and not state.initialised:
            return None  # cudaMallocAsync: 0s without creating a context
        return state

    def memory_reserved(self, device=None) -> int:
        state = self._stats_only(device)
        return state.reserved if state else 0

    def max_memory_reserved(self, device=None) -> int:
        state = self._stats_only(device)
        return state.peak_reserved if state else 0

    def max_memory_allocated(self, device=None) -> int:
        state = self._stats_only(device)
        return state.peak_allocated if state else 0

    def memory_allocated(self, device=None) -> int:
        state = self._stats_only(device)
        return state.allocated if state else 0

    def memory_stats(self, device=None) -> dict:
        if self._stats_only(device) is None:
            return {}
        state = self.devices[self._index(device)]
        initialised, state.initialised = state.initialised, True  # the parent's reads, without a context
        try:
            return FakeCuda.memory_stats(self, device)
        finally:
            state.initialised = initialised

    def contexts(self) -> list[int]:
        return [call[1] for call in self.calls if call[0] == "context"]
