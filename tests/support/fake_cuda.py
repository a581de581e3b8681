"""A fake CUDA device and ``torch.cuda`` for unit tests: what isoprobe's CUDA code relies on, modelled from torch's
documented behaviour, so that the readings' arithmetic and the budget's meaning are tested without a GPU.

What it models, and where torch says so:

- **The card** (``FakeCard``): its total, what other processes hold, and a UUID (``GPU-...``, or ``MIG-...`` for a
  MIG instance, whose total is the instance's). ``cudaMemGetInfo`` is device-wide: ``free`` leaves out everything
  any process holds, this one's cache included.
- **Memory outside the allocator** (``FakeCuda.outside``): the context (a few hundred MiB once initialised), then
  what loads later, each when first used: the libraries' handles and workspaces (cuBLAS, cuDNN), kernels loaded
  lazily (``CUDA_MODULE_LOADING=LAZY``, torch's default), Triton cubins under ``compile``, NCCL's buffers, a new
  stream's handles (``load``). None of it is in ``memory_reserved``; all of it is in ``mem_get_info``.
- **The caching allocator** (native): requests rounded to 512 bytes; under 1 MiB from 2 MiB segments, 1 to 10 MiB
  from 20 MiB segments, above that a segment of its own rounded up to 2 MiB (c10/cuda/CUDACachingAllocator.cpp,
  ``get_allocation_size``). ``set_per_process_memory_fraction`` caps *reserved* bytes at ``fraction * total``.
  A request that would pass the cap or the card first frees the cached segments no tensor uses, then retries
  (``num_alloc_retries``), and only then raises ``torch.OutOfMemoryError``: so near the cap the reserved peak
  reaches the cap for a batch that fits. Free space left inside a used segment is ``inactive_split_bytes``.
- **cudaMallocAsync**: the fraction caps bytes *in use*; ``max_memory_reserved`` is the pool's high-water mark.
- **Readings without a context**: the allocator's counters (``memory_reserved``, the peaks, ``memory_stats``) are
  read without a CUDA call, so they create no context (a device never used reads zero); ``mem_get_info`` does.
- **NCCL's out of memory**: ``torch.distributed.DistBackendError`` with NCCL's own text (``NCCL_OOM_MESSAGE``).
- **Per torch version** (``torch_version``; issue 57, read in c10's sources and the wheels' binaries): before 2.10
  ``set_per_process_memory_fraction`` calls ``SetDevice`` and ``cudaMemGetInfo`` (a context on that device, and it
  is left current); ``get_per_process_memory_fraction`` exists from 2.6 (and does the same before 2.10).
  ``torch.cuda.device(i)`` switches to ``i`` (a context there) and puts the previous device back without one.
- **Expandable segments** (``expandable=True``): each pool is one segment whose pages (2 MiB small, 20 MiB large)
  are mapped as it grows; ``reserved`` is the mapped bytes; expandable blocks never count in ``inactive_split``, nor
  in ``segment.*``; the cap refuses ``reserved + the request's segment size`` above the fraction; a retry unmaps
  the free pages.
- **Retries accumulate** from the process's start: ``reset_peak_memory_stats`` leaves ``num_alloc_retries`` alone,
  ``reset_accumulated_memory_stats`` zeroes it.
- **Kernels load lazily after the warm-up** (``lazy_kernel_bytes``, 40 MiB by default): the first allocation after
  ``warm_up`` loads them outside the allocator, as the model's first layers load theirs.
- **A library handle's creation** (``create_handle``): from the driver, outside the allocator, with no release of
  its cache: ``CUBLAS_STATUS_NOT_INITIALIZED`` when the card has no room, whatever the cache holds.
- **NVML's per-process figures** (``fake_pynvml``): this process's context, libraries and reserved bytes under its
  pid; other processes' under theirs (or this pid unlisted: a container's own pid namespace).

Only what isoprobe calls is here; a call it does not model raises ``AttributeError``, which a test shows.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

KiB = 1024
MiB = 1024**2
GiB = 1024**3

#: c10/cuda/CUDACachingAllocator.cpp's sizes.
SMALL_SIZE = 1 * MiB        # kSmallSize: requests up to this come from small segments
SMALL_BUFFER = 2 * MiB      # kSmallBuffer
LARGE_BUFFER = 20 * MiB     # kLargeBuffer: the segment of a 1 to 10 MiB request
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: above this a request gets a segment of its own
ROUND_LARGE = 2 * MiB       # kRoundLarge
MIN_BLOCK = 512             # kMinBlockSize

#: What torch raises when NCCL's cudaMalloc fails (ProcessGroupNCCL, as ``DistBackendError``): NCCL's CUDACHECK
#: wording, ``Cuda failure %d '%s'`` with cudaErrorMemoryAllocation (2), under the unhandled-CUDA-error headline.
NCCL_OOM_MESSAGE = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with "
    "NCCL_DEBUG=INFO for details), NCCL version 2.27.5\n"
    "ncclUnhandledCudaError: Call to CUDA function failed.\n"
    "Last error:\n"
    "Cuda failure 2 'out of memory'")

#: The caching allocator's own wording of an out-of-memory (torch 2.x, ``c10::OutOfMemoryError``).
ALLOCATOR_OOM = ("CUDA out of memory. Tried to allocate {size}. GPU 0 has a total capacity of {total} of which "
                 "{free} is free. Of the allocated memory {allocated} is allocated by PyTorch, and {unallocated} is "
                 "reserved by PyTorch but unallocated.")


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError (``torch.cuda.OutOfMemoryError``): a RuntimeError subclass."""


class DistError(RuntimeError):
    pass


class DistBackendError(DistError):
    """torch.distributed.DistBackendError: what a failed NCCL call raises."""


def _mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB"


@dataclass
class FakeCard:
    """One GPU (or one MIG instance) as the driver reports it."""

    total: int = 80 * GiB
    others: int = 0                 # what other processes hold on it
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    name: str = "NVIDIA H100 80GB HBM3"
    capability: tuple[int, int] = (9, 0)


@dataclass
class _Segment:
    size: int
    used: int = 0
    large: bool = True

    def room(self) -> int:
        return self.size - self.used


def segment_size(request: int) -> int:
    """c10's ``get_allocation_size``: the segment a request of ``request`` (rounded) bytes gets when none has room."""
    if request <= SMALL_SIZE:
        return SMALL_BUFFER
    if request < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-request // ROUND_LARGE) * ROUND_LARGE


def round_request(size: int) -> int:
    """c10's ``round_size``: a multiple of 512 bytes."""
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


@dataclass
class _Block:
    size: int
    segment: _Segment | None  # None under cudaMallocAsync and for expandable segments
    pool: str | None = None   # expandable segments: "small" or "large"


#: Expandable segments' page sizes (c10: kSmallBuffer for the small pool, kLargeBuffer for the large).
EXPANDABLE_PAGE = {"small": SMALL_BUFFER, "large": LARGE_BUFFER}


@dataclass
class _Device:
    card: FakeCard
    fraction: float = 1.0
    segments: list[_Segment] = field(default_factory=list)
    allocated: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    peak_inactive_split: int = 0
    retries: int = 0
    ooms: int = 0
    outside: int = 0
    initialised: bool = False
    #: expandable segments: pool -> [mapped bytes, used bytes]
    expandable: dict = field(default_factory=lambda: {"small": [0, 0], "large": [0, 0]})
    peak_segments: int = 0

    @property
    def reserved(self) -> int:
        return sum(s.size for s in self.segments) + sum(mapped for mapped, _ in self.expandable.values())

    @property
    def inactive_split(self) -> int:
        return sum(s.room() for s in self.segments if s.used)


class FakeCuda:
    """``torch.cuda`` of one process: the calls isoprobe makes, over ``cards`` (the visible devices, in order).

    ``context_bytes``: what initialising a device takes outside the allocator; ``warm_up_bytes``: what the first
    matmul and convolution load (cuBLAS and cuDNN handles, workspaces, their kernels).
    """

    def __init__(self, *cards: FakeCard, context_bytes: int = 500 * MiB, warm_up_bytes: int = 0,
                 backend: str = "native", available: bool = True, torch_version: str = "2.11.0",
                 expandable: bool = False, lazy_kernel_bytes: int = 40 * MiB):
        self.cards = list(cards) or [FakeCard()]
        self.context_bytes = context_bytes
        self.warm_up_bytes = warm_up_bytes
        self.backend = backend
        self.available = available
        self.torch_version = torch_version
        self.expandable = expandable
        self.lazy_kernel_bytes = lazy_kernel_bytes
        self.kernels_due: set[int] = set()  # devices warmed up whose model kernels have not loaded yet
        # Plain attributes, as torch.cuda's functions are (the shim replaces them by identity); the getter only where
        # the version has it.
        self.set_per_process_memory_fraction = self._set_fraction
        if self._version() >= (2, 6):
            self.get_per_process_memory_fraction = self._get_fraction
        self.devices = [_Device(card) for card in self.cards]
        self.current = 0
        self.driver_initialised = False  # cuInit ran (is_available does it; is_initialized does not say)
        self.calls: list[tuple] = []
        self.memory = types.SimpleNamespace(get_allocator_backend=lambda: self.backend)
        self.OutOfMemoryError = OutOfMemoryError

    def _version(self) -> tuple[int, int]:
        major, minor = self.torch_version.split("+")[0].split(".")[:2]
        return int(major), int(minor)

    # ------------------------------------------------------------------ the device and its context

    def _index(self, device) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            return device
        if not isinstance(device, str) and getattr(device, "index", None) is not None:
            return device.index  # a torch.device
        text = str(device)
        return int(text.split(":", 1)[1]) if ":" in text else self.current

    def _device(self, device) -> _Device:
        index = self._index(device)
        if not 0 <= index < len(self.devices):
            raise RuntimeError("CUDA error: invalid device ordinal")
        state = self.devices[index]
        if not state.initialised:  # the primary context of a device is created by its first use
            state.initialised = True
            self.driver_initialised = True
            self.calls.append(("context", index))
            self._take_outside(state, self.context_bytes, "context")
        return state

    def _take_outside(self, state: _Device, nbytes: int, what: str) -> None:
        if self._card_used(state) + nbytes > state.card.total:
            raise RuntimeError(f"CUDA error: out of memory ({what})")
        state.outside += nbytes

    def _card_used(self, state: _Device) -> int:
        return state.card.others + state.outside + state.reserved

    def is_available(self) -> bool:
        self.driver_initialised = True  # cudaGetDeviceCount runs cuInit
        return self.available and bool(self.cards)

    def is_initialized(self) -> bool:
        return any(d.initialised for d in self.devices)

    def init(self) -> None:
        self.calls.append(("init",))
        self._device(self.current)

    def device_count(self) -> int:
        return len(self.cards)

    def set_device(self, device) -> None:
        self.current = self._index(device)
        self.calls.append(("set_device", self.current))
        self._device(self.current)

    def current_device(self) -> int:
        return self.current

    def get_device_properties(self, device=None):
        card = self.cards[self._index(device)]
        return types.SimpleNamespace(total_memory=card.total, name=card.name, uuid=card.uuid,
                                     major=card.capability[0], minor=card.capability[1])

    def synchronize(self, device=None) -> None:
        self.calls.append(("synchronize", self._index(device)))
        self._device(device)

    def load(self, nbytes: int, what: str = "kernels", device=None) -> None:
        """Memory outside the allocator that comes later: lazily loaded kernels, Triton cubins, NCCL's buffers,
        a new stream's library handles. Fails as the driver does when the card has no room."""
        self._take_outside(self._device(device), nbytes, what)

    def warm_up(self, device=None) -> None:
        """What isoprobe's warm-up (a matmul and a convolution) makes the libraries load; the model's own kernels
        load later, at its first allocation (``lazy_kernel_bytes``)."""
        if self.warm_up_bytes:
            self.load(self.warm_up_bytes, "cuBLAS and cuDNN", device)
        self.kernels_due.add(self._index(device))

    def create_handle(self, nbytes: int, library: str = "cuBLAS", device=None) -> None:
        """A library handle created from the driver (``cublasCreate``): no release of the allocator's cache first."""
        state = self._device(device)
        if self._card_used(state) + nbytes > state.card.total:
            call = "cublasCreate(handle)" if library == "cuBLAS" else "cudnnCreate(&handle)"
            status = "CUBLAS_STATUS_NOT_INITIALIZED" if library == "cuBLAS" else "CUDNN_STATUS_NOT_INITIALIZED"
            raise RuntimeError(f"CUDA error: {status} when calling `{call}`")
        state.outside += nbytes

    def device(self, index):
        """``torch.cuda.device(i)``: ``i`` current inside (its context created), the previous device back after,
        without a context there (c10's ``MaybeExchangeDevice``)."""
        import contextlib

        @contextlib.contextmanager
        def guard():
            previous = self.current
            self.set_device(index)
            try:
                yield
            finally:
                self.current = previous
                self.calls.append(("device_back", previous))
        return guard()

    def _get_nvml_device_index(self, device) -> int:
        return self._index(device)

    # ------------------------------------------------------------------ the allocator

    def _set_fraction(self, fraction: float, device=None) -> None:
        """Native from torch 2.10: caps against the device's properties (``totalGlobalMem``), no context. Before
        2.10: ``SetDevice`` and ``cudaMemGetInfo`` first (a context, the device left current). cudaMallocAsync's
        asks ``cudaMemGetInfo`` under a device guard, which creates one."""
        if not isinstance(fraction, float) or not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        index = self._index(device)
        if self.backend == "native" and self._version() < (2, 10):
            self.set_device(index)
        state = self._device(device) if self.backend == "cudaMallocAsync" else self._counters(device)
        state.fraction = fraction
        self.calls.append(("fraction", fraction, index))

    def _get_fraction(self, device=None) -> float:
        if self._version() < (2, 10):
            self.set_device(self._index(device))
        return self._counters(device).fraction

    def _counters(self, device) -> _Device:
        """The allocator's own counters for ``device``: read without any CUDA call, so without a context (a device
        never used reads zero), as torch's memory statistics are."""
        index = self._index(device)
        if not 0 <= index < len(self.devices):
            raise RuntimeError("CUDA error: invalid device ordinal")
        return self.devices[index]

    def _cap(self, state: _Device) -> int:
        return int(state.fraction * state.card.total)

    def allocate(self, size: int, device=None) -> _Block:
        """A tensor of ``size`` bytes: the allocator's path, with its free-and-retry near the cap."""
        state = self._device(device)
        index = self._index(device)
        if index in self.kernels_due and self.lazy_kernel_bytes:
            self.kernels_due.discard(index)
            self._take_outside(state, self.lazy_kernel_bytes, "the model's kernels, loaded lazily")
        request = round_request(size)
        if self.backend == "cudaMallocAsync":
            return self._allocate_async(state, request)
        if self.expandable:
            return self._allocate_expandable(state, request)
        small = request <= SMALL_SIZE
        for segment in state.segments:
            if segment.large != (not small) or segment.room() < request:
                continue
            return self._place(state, segment, request)
        new = segment_size(request)
        if not self._fits(state, new):
            self._release_cached(state)
            state.retries += 1
            if not self._fits(state, new):
                state.ooms += 1
                free = max(0, state.card.total - self._card_used(state))
                raise OutOfMemoryError(ALLOCATOR_OOM.format(
                    size=_mib(request), total=f"{state.card.total / GiB:.2f} GiB", free=_mib(free),
                    allocated=_mib(state.allocated), unallocated=_mib(state.reserved - state.allocated)))
        segment = _Segment(new, large=not small)
        state.segments.append(segment)
        state.peak_reserved = max(state.peak_reserved, state.reserved)
        state.peak_segments = max(state.peak_segments, len(state.segments))
        return self._place(state, segment, request)

    def _allocate_expandable(self, state: _Device, request: int) -> _Block:
        """Expandable segments: the pool's mapped pages grow by whole pages; the cap counts every mapped byte plus
        the request's segment size (c10's ``alloc_block``); a retry unmaps the free pages (``release_cached_blocks``)."""
        pool = "small" if request <= SMALL_SIZE else "large"
        mapped, used = state.expandable[pool]
        if mapped - used < request:
            page = EXPANDABLE_PAGE[pool]
            grow = -(-(used + request - mapped) // page) * page
            if not self._fits(state, segment_size(request)) or self._card_used(state) + grow > state.card.total:
                self._unmap_free_pages(state)
                state.retries += 1
                mapped = state.expandable[pool][0]
                grow = -(-max(0, used + request - mapped) // page) * page
                if not self._fits(state, segment_size(request)) or self._card_used(state) + grow > state.card.total:
                    state.ooms += 1
                    raise OutOfMemoryError(ALLOCATOR_OOM.format(
                        size=_mib(request), total=f"{state.card.total / GiB:.2f} GiB",
                        free=_mib(max(0, state.card.total - self._card_used(state))),
                        allocated=_mib(state.allocated), unallocated=_mib(state.reserved - state.allocated)))
            state.expandable[pool][0] = mapped + grow
        state.expandable[pool][1] = used + request
        state.allocated += request
        state.peak_allocated = max(state.peak_allocated, state.allocated)
        state.peak_reserved = max(state.peak_reserved, state.reserved)
        return _Block(request, None, pool)

    def _unmap_free_pages(self, state: _Device) -> None:
        for pool, (mapped, used) in state.expandable.items():
            page = EXPANDABLE_PAGE[pool]
            state.expandable[pool][0] = -(-used // page) * page

    def _fits(self, state: _Device, new: int) -> bool:
        return state.reserved + new <= self._cap(state) and self._card_used(state) + new <= state.card.total

    def _place(self, state: _Device, segment: _Segment, request: int) -> _Block:
        segment.used += request
        state.allocated += request
        state.peak_allocated = max(state.peak_allocated, state.allocated)
        state.peak_inactive_split = max(state.peak_inactive_split, state.inactive_split)
        return _Block(request, segment)

    def _allocate_async(self, state: _Device, request: int) -> _Block:
        if state.allocated + request > self._cap(state) or self._card_used(state) + request > state.card.total:
            state.ooms += 1
            raise OutOfMemoryError(f"Allocation on device would exceed allowed memory. (out of memory)\n"
                                   f"Currently allocated     : {_mib(state.allocated)}")
        pool = _Segment(request, request)  # the pool grows by what is in use and keeps it until trimmed
        state.segments.append(pool)
        state.allocated += request
        state.peak_allocated = max(state.peak_allocated, state.allocated)
        state.peak_reserved = max(state.peak_reserved, state.reserved)
        return _Block(request, pool)

    def free(self, block: _Block, device=None) -> None:
        state = self._device(device)
        state.allocated -= block.size
        if block.pool is not None:
            state.expandable[block.pool][1] -= block.size  # its pages stay mapped until a release
        elif block.segment is not None:
            block.segment.used -= block.size
            if self.backend == "cudaMallocAsync":
                block.segment.used = 0  # back in the pool: still reserved (the pool's high-water)

    def _release_cached(self, state: _Device) -> None:
        state.segments = [s for s in state.segments if s.used]
        self._unmap_free_pages(state)

    def empty_cache(self) -> None:
        for state in self.devices:
            if state.initialised:
                self._release_cached(state)

    # ------------------------------------------------------------------ the readings

    def mem_get_info(self, device=None) -> tuple[int, int]:
        state = self._device(device)
        return max(0, state.card.total - self._card_used(state)), state.card.total

    def memory_reserved(self, device=None) -> int:
        return self._counters(device).reserved

    def memory_allocated(self, device=None) -> int:
        return self._counters(device).allocated

    def max_memory_reserved(self, device=None) -> int:
        return self._counters(device).peak_reserved

    def max_memory_allocated(self, device=None) -> int:
        return self._counters(device).peak_allocated

    def reset_peak_memory_stats(self, device=None) -> None:
        state = self._counters(device)
        state.peak_allocated = state.allocated
        state.peak_reserved = state.reserved
        state.peak_inactive_split = state.inactive_split
        state.peak_segments = len(state.segments)

    def reset_accumulated_memory_stats(self, device=None) -> None:
        state = self._counters(device)
        state.retries = 0
        state.ooms = 0

    def memory_stats(self, device=None) -> dict[str, int]:
        state = self._counters(device)
        if not state.initialised:
            return {}  # torch's memory_stats before the device is in use
        stats = {"allocated_bytes.all.current": state.allocated, "allocated_bytes.all.peak": state.peak_allocated,
                 "reserved_bytes.all.current": state.reserved, "reserved_bytes.all.peak": state.peak_reserved,
                 "num_ooms": state.ooms}
        if self.backend == "native":  # cudaMallocAsync keeps no segments of its own: no splits, no retries
            stats.update({"inactive_split_bytes.all.current": state.inactive_split,
                          "inactive_split_bytes.all.peak": state.peak_inactive_split,
                          "segment.all.current": len(state.segments), "segment.all.peak": state.peak_segments,
                          "num_alloc_retries": state.retries})
        return stats


def fake_pynvml(cuda: FakeCuda, pid: int | None = None, listed: bool = True, other_pid: int = 4242):
    """``pynvml`` over the fake's cards: per process, this one's context, libraries and reserved bytes under ``pid``
    (this process's by default; ``listed`` False: not listed, as in a container's own pid namespace), and each
    card's ``others`` under ``other_pid``."""
    import os

    own = os.getpid() if pid is None else pid

    def processes(handle):
        state = cuda.devices[handle]
        found = []
        if listed and state.initialised:
            found.append(types.SimpleNamespace(pid=own, usedGpuMemory=state.outside + state.reserved))
        if state.card.others:
            found.append(types.SimpleNamespace(pid=other_pid, usedGpuMemory=state.card.others))
        return found

    return types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda index: index,
                                 nvmlDeviceGetComputeRunningProcesses=processes)


def fake_torch(cuda: FakeCuda) -> types.SimpleNamespace:
    """A ``torch`` namespace holding the fake: ``torch.cuda`` and ``torch.device`` as isoprobe's CUDA code uses them."""

    def device(spec, index=None):
        text = str(spec) if index is None else f"{spec}:{index}"
        kind, _, number = text.partition(":")
        return types.SimpleNamespace(type=kind, index=int(number) if number else None, __str__=lambda: text)

    return types.SimpleNamespace(cuda=cuda, device=device, OutOfMemoryError=OutOfMemoryError, __version__=cuda.torch_version,
                                 distributed=types.SimpleNamespace(DistBackendError=DistBackendError),
                                 float32="float32", bfloat16="bfloat16", float16="float16")
