"""The CUDA readings, in the budget's units: the one implementation for isoprobe's own trials (``child.cuda``), the
step reports (``child.step_report``) and a command trial's shim (``child/shim/_isoprobe_shim.py``).

Standard library only, handed ``torch.cuda``: the shim loads this file by path in the user's process (it imports
nothing of isoprobe by name), as ``child/srun_rank.py`` loads its stdlib-only modules.

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
"""


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


def outside_allocator_bytes(free_bytes, total_bytes, reserved_bytes):
    """Memory in use on the card that this process's allocator did not reserve.

    Read where no other process uses the card (a trial's GPU), this is the process's own context, library handles
    and kernels. Other processes' memory counts here too: on a shared card they take memory from the trial as much.
    """
    return max(0, total_bytes - free_bytes - reserved_bytes)


def allocator_backend(cuda):
    """'native' (the caching allocator) or 'cudaMallocAsync'."""
    try:
        return cuda.memory.get_allocator_backend()
    except Exception:  # an allocator that cannot say: treat it as torch's own
        return "native"


def allocator_need(reserved_peak, allocated_peak, split_peak, asynchronous):
    """The bytes the allocator needed, in the units its cap counts (see the module's docstring).

    Native: the allocated peak plus the peak of free space inside used segments (``inactive_split_bytes``), never
    above the reserved peak (which holds both); without that statistic, the reserved peak. cudaMallocAsync: the
    allocated peak (its reserved peak is the pool's high-water mark).
    """
    if asynchronous:
        return allocated_peak
    if split_peak is None:
        return reserved_peak
    return min(reserved_peak, allocated_peak + split_peak)


def card_reading(cuda, device):
    """One device's readings now, in the budget's units: ``budget_peak_bytes`` (the allocator's need so far plus what
    lies outside it now), with the parts it is made of. ``cuda`` is ``torch.cuda``. One function, so the steps, the
    verdict and a command's steps compare the same thing whichever allocator runs."""
    free, total = cuda.mem_get_info(device)
    reserved = cuda.memory_reserved(device)
    reserved_peak = cuda.max_memory_reserved(device)
    allocated_peak = cuda.max_memory_allocated(device)
    try:
        stats = dict(cuda.memory_stats(device))
    except Exception:  # an allocator without statistics: the reserved peak stands for the need
        stats = {}
    asynchronous = allocator_backend(cuda) == "cudaMallocAsync"
    need = allocator_need(reserved_peak, allocated_peak, stats.get("inactive_split_bytes.all.peak"), asynchronous)
    outside = outside_allocator_bytes(free, total, reserved)
    return {"reserved_peak": reserved_peak, "allocated_peak": allocated_peak, "need": need, "outside": outside,
            "budget_peak_bytes": need + outside, "retries": int(stats.get("num_alloc_retries", 0)),
            "held": cuda.memory_allocated(device)}


def step_readings(cuda, device):
    """After a step (``protocol.StepDone`` fields): the reserved peak so far, what is held now, and the budget's
    reading (``card_reading``)."""
    reading = card_reading(cuda, device)
    return {"peak_bytes": reading["reserved_peak"], "held_bytes": reading["held"],
            "budget_peak_bytes": reading["budget_peak_bytes"]}
