"""The CUDA readings, in the budget's units: the one implementation for isoprobe's own trials (``child.core.cuda``), the
step reports (``child.core.step_report``) and a command trial's shim (``child/shim/_isoprobe_shim.py``).

Standard library only, handed ``torch.cuda``: the shim loads this file by path in the user's process (it imports
nothing of isoprobe by name), through the standalone layer's one loader (``system.standalone``).

- **The budget is what the process may use on the card, context included** (a smaller card's reported total).
  ``set_per_process_memory_fraction`` limits the allocator only, to the fraction of the card's total memory
  (``totalGlobalMem``; torch before 2.8 read ``cudaMemGetInfo``'s total: the same figure); the context, the
  library handles and the loaded kernels lie outside it, so what the process holds outside the allocator is taken
  off the budget before the fraction is computed (``budget_fraction``).
- **Every reading is in the budget's units** (``card_reading``): the allocator's need plus what lies outside it
  now, read at every step. Memory outside the allocator keeps coming (lazily loaded kernels, Triton's cubins,
  NCCL's buffers, new streams' handles): a reading taken once would miss it.
- **The allocator's need, not its reserved peak** (``allocator_need``). Near the cap the caching allocator frees
  its unused cached segments and retries (``num_alloc_retries``), so its reserved peak reaches the cap for a batch
  that fits: that peak measures the cap, not the batch. The allocated peak plus the most its used segments held
  free inside them (``inactive_split_bytes``, the fragmentation a retry cannot give back) is what the batch needs.
  Under ``backend:cudaMallocAsync`` the fraction caps bytes in use (``pytorch_used_bytes`` against
  ``pytorch_memory_limits``, c10/cuda/CUDAMallocAsyncAllocator.cpp), so the need is the allocated peak.
- **Under expandable segments the need is the mapped bytes' peak** (``max_memory_reserved``). c10 keeps expandable
  blocks out of ``inactive_split`` (``free_block``, ``alloc_found_block``: "fully free pages of expandable blocks
  can always be freed"), so that statistic stays near 0, while the cap counts every mapped page (``map_block`` adds
  to ``total_allocated_memory`` and ``reserved_bytes``; ``alloc_block`` refuses ``total_allocated_memory + size``
  above the fraction). The allocated peak alone overstated the margin and called a batch at the cap safe.
- **What lies outside the allocator is this process's own** (``outside_bytes``): NVML's per-process figure
  (``nvmlDeviceGetComputeRunningProcesses``, this pid's ``usedGpuMemory``) less the allocator's reserved bytes.
  ``cudaMemGetInfo`` is card-wide: ``total - free - reserved`` counts a neighbour's memory as this trial's, and a
  neighbour holding the budget left the fraction at 0. Where NVML cannot say (no pynvml, a container that does not
  share the host's pid namespace, Windows WDDM, MIG), the card-wide figure stands: conservative, a neighbour's
  memory is taken off the budget, never added to it.
- **The fraction is set where it creates no context** (``fraction_creates_context``): torch before 2.10 sets it
  with ``SetDevice`` and ``cudaMemGetInfo`` (``NativeCachingAllocator::setMemoryFraction``; 2.10 caps against
  ``device_prop.totalGlobalMem``), a context on every device it is set on, and the device left current;
  ``get_per_process_memory_fraction`` exists from 2.6 on.
"""

import os


def budget_fraction(budget_bytes, total_bytes, outside_bytes, script_fraction=None):
    """The allocator's fraction of a card of ``total_bytes`` so that the allocator and the ``outside_bytes`` (context,
    library handles, kernels) stay within the budget; a script's own fraction (the shim) is of the budget. A budget
    smaller than the outside memory leaves the allocator nothing: every allocation then fails, an honest
    out-of-memory."""
    if total_bytes <= 0:
        raise ValueError(f"total memory must be positive, not {total_bytes}")
    allowed = max(0, budget_bytes - max(0, outside_bytes))
    if script_fraction is not None:
        allowed = min(allowed, int(script_fraction * budget_bytes))
    return min(1.0, allowed / total_bytes)


def outside_allocator_bytes(free_bytes, total_bytes, reserved_bytes, own_bytes=None):
    """Memory this process holds on the card that its allocator did not reserve: its context, library handles and
    kernels. ``own_bytes`` (NVML's figure for this process) where known; else the card-wide ``total - free``, which
    counts other processes' memory too (see the module's docstring)."""
    if own_bytes is not None:
        return max(0, own_bytes - reserved_bytes)
    return max(0, total_bytes - free_bytes - reserved_bytes)


def allocator_backend(cuda):
    """'native' (the caching allocator) or 'cudaMallocAsync'."""
    try:
        return cuda.memory.get_allocator_backend()
    except Exception:  # an allocator that cannot say: treat it as torch's own
        return "native"


def allocator_need(reserved_peak, allocated_peak, split_peak, asynchronous, expandable=False):
    """The bytes the allocator needed, in the units its cap counts (see the module's docstring).

    Native: the allocated peak plus the peak of free space inside used segments (``inactive_split_bytes``), never
    above the reserved peak (which holds both); without that statistic, the reserved peak. Expandable segments: the
    reserved peak, the mapped pages the cap counts (``inactive_split`` leaves them out). cudaMallocAsync: the
    allocated peak (its reserved peak is the pool's high-water mark).
    """
    if asynchronous:
        return allocated_peak
    if split_peak is None or expandable:
        return reserved_peak
    return min(reserved_peak, allocated_peak + split_peak)


#: The allocator's settings, as torch reads them (newer releases read the second too; isoprobe sets both).
ALLOC_CONF_ENVS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def expandable_segments(stats, environ=None):
    """Whether the native allocator maps expandable segments: its setting says so (the last
    ``expandable_segments`` key of the settings torch reads), or its statistics do (memory reserved while no
    segment was ever counted: ``segment.*`` counts cudaMalloc'd segments only, ``map_block`` only
    ``reserved_bytes``)."""
    environ = os.environ if environ is None else environ
    for name in ALLOC_CONF_ENVS:
        said = None
        for token in (environ.get(name) or "").split(","):
            key, _, value = token.partition(":")
            if key.strip() == "expandable_segments":
                said = value.strip().lower() == "true"
        if said is not None:
            return said
    return stats.get("reserved_bytes.all.peak", 0) > 0 and stats.get("segment.all.peak") == 0


def fraction_creates_context(version):
    """torch before 2.10: ``set_per_process_memory_fraction(f, d)`` calls ``SetDevice(d)`` and ``cudaMemGetInfo``
    (a context on ``d``, and ``d`` left current). An unreadable version counts as old: the careful path."""
    try:
        major, minor = (int(part) for part in str(version).split("+")[0].split(".")[:2])
    except ValueError:
        return True
    return (major, minor) < (2, 10)


#: NVML once initialised (``"module"``: pynvml), or ``"failed"``: True once it could not be.
_NVML: "dict[str, object]" = {}


def own_process_bytes(cuda, device):
    """What this process holds on ``device`` by NVML's count (context, libraries and allocator together), or None
    where NVML cannot say (see the module's docstring). NVML is initialised once; a failure is remembered."""
    if _NVML.get("failed"):
        return None
    try:
        if "module" not in _NVML:
            import pynvml

            pynvml.nvmlInit()
            _NVML["module"] = pynvml
        nvml = _NVML["module"]
        index = device if isinstance(device, int) else getattr(device, "index", None)
        to_nvml = getattr(cuda, "_get_nvml_device_index", None)  # CUDA_VISIBLE_DEVICES's order to NVML's
        nvml_index = to_nvml(index if index is not None else cuda.current_device()) if to_nvml else index
        handle = nvml.nvmlDeviceGetHandleByIndex(nvml_index)
        pid = os.getpid()
        for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == pid:
                used = process.usedGpuMemory
                return int(used) if used else None  # None: NVML_VALUE_NOT_AVAILABLE; 0: a container's view
        return None  # not listed: a pid namespace of our own
    except Exception:
        _NVML["failed"] = True
        return None


def outside_now(cuda, device):
    """What this process holds outside the allocator on ``device`` now (``outside_allocator_bytes``, NVML's figure
    where it can say), and the card's total."""
    free, total = cuda.mem_get_info(device)
    return outside_allocator_bytes(free, total, cuda.memory_reserved(device), own_process_bytes(cuda, device)), total


def card_reading(cuda, device):
    """One device's readings now, in the budget's units: ``budget_peak_bytes`` (the allocator's need so far plus what
    lies outside it now), with the parts it is made of. ``cuda`` is ``torch.cuda``. One function, so the steps, the
    verdict and a command's steps compare the same thing whichever allocator runs."""
    outside, _ = outside_now(cuda, device)
    reserved_peak = cuda.max_memory_reserved(device)
    allocated_peak = cuda.max_memory_allocated(device)
    try:
        stats = dict(cuda.memory_stats(device))
    except Exception:  # an allocator without statistics: the reserved peak stands for the need
        stats = {}
    asynchronous = allocator_backend(cuda) == "cudaMallocAsync"
    need = allocator_need(
        reserved_peak,
        allocated_peak,
        stats.get("inactive_split_bytes.all.peak"),
        asynchronous,
        not asynchronous and expandable_segments(stats),
    )
    return {
        "reserved_peak": reserved_peak,
        "allocated_peak": allocated_peak,
        "need": need,
        "outside": outside,
        "budget_peak_bytes": need + outside,
        "retries": int(stats.get("num_alloc_retries", 0)),
        "held": cuda.memory_allocated(device),
    }


def step_readings(cuda, device):
    """After a step (``protocol.StepDone`` fields): the reserved peak so far, what is held now, and the budget's
    reading (``card_reading``)."""
    reading = card_reading(cuda, device)
    return {
        "peak_bytes": reading["reserved_peak"],
        "held_bytes": reading["held"],
        "budget_peak_bytes": reading["budget_peak_bytes"],
    }
