"""CUDA in a child: initialisation, the libraries' warm-up, the budget, and the readings.

Child-side only (it is handed ``torch``; the parent never imports it). Why each step:

- **Initialise first, inside the trial's ``try``.** CUDA's lazy initialisation builds the
  caching allocator, which parses ``PYTORCH_CUDA_ALLOC_CONF`` then: an unknown key raises
  there, and a raise outside the trial's ``try`` would be no verdict at all.
- **Warm the libraries up before the model exists.** cuBLAS and cuDNN create their handles,
  workspaces and load their kernels on first use, partly outside the caching allocator. In a CNN
  the first cuBLAS call is the last layer, at the activations' peak: that memory would be taken
  at the worst moment and reported as a library error ("CUBLAS_STATUS_NOT_INITIALIZED"). Taken
  here, in the trial's dtype, it is held before the peak and counted.
- **The budget is what the process may use on the card, context included** (a smaller card's
  reported total). ``set_per_process_memory_fraction`` limits the caching allocator only; the
  context, the library handles and the loaded kernels lie outside it. On the smaller card they take
  memory too, so what the process holds outside the allocator after the warm-up is taken off the
  budget before the fraction is computed.
- **Every reading is in the budget's units** (``card_reading``): the allocator's need plus what lies
  outside it, read again at every step. Memory outside the allocator keeps coming after the
  warm-up (kernels loaded lazily, torch's default ``CUDA_MODULE_LOADING=LAZY``; Triton's cubins under
  ``compile``; NCCL's buffers, connected per algorithm on first use; library handles for a new
  stream): a reading taken once would miss it, and the fraction set from the warm-up's figure lets
  the allocator fill what that memory then takes. A reading above the budget is over it
  (``pipeline.plausibility.over_budget``): the smaller card would have run out.
- **The allocator's need, not its reserved peak** (``allocator_need``). Near the cap the caching
  allocator frees its unused cached segments and retries (``num_alloc_retries``), so its reserved
  peak reaches the cap for a batch that fits every time: that peak measures the cap, not the
  batch. The allocated peak plus the most its used segments held free inside them
  (``inactive_split_bytes``, the fragmentation a retry cannot give back) is what the batch needs,
  and it does not move with the retries. Under ``backend:cudaMallocAsync`` the fraction caps bytes
  in use, so the need is the allocated peak, in steps and at the end alike.
"""

from __future__ import annotations

from typing import Any

#: bfloat16 needs compute capability 8.0 (Ampere) or newer. ``torch.cuda.is_bf16_supported()``
#: is no rule for this: it returns True for emulated bf16 by default (``including_emulation=True``
#: in torch 2.14) and asks about the *current* device, not the trial's.
BF16_CAPABILITY = (8, 0)

#: Precision -> (dtype of the warm-up's tensors, autocast dtype or None), as torch attribute names.
_WARM_UP_DTYPES = {
    "fp32": ("float32", None),
    "fp16-mixed": ("float32", "float16"),
    "bf16-mixed": ("float32", "bfloat16"),
    "bf16-true": ("bfloat16", None),
}


def bf16_supported(capability: tuple[int, int]) -> bool:
    """Pure: can a GPU of this compute capability run bfloat16 natively?"""
    return tuple(capability) >= BF16_CAPABILITY


def budget_fraction(budget_bytes: int, total_bytes: int, outside_bytes: int) -> float:
    """Pure: the caching allocator's fraction so that allocator plus outside memory stay within the budget.

    ``total_bytes`` is what the card reports (``cudaMemGetInfo``'s total, which torch's allocator
    multiplies the fraction by); ``outside_bytes`` is what this process holds outside the allocator
    (context, library handles, kernels). A budget smaller than that leaves the allocator nothing:
    every allocation then fails, an honest out-of-memory.
    """
    if total_bytes <= 0:
        raise ValueError(f"total memory must be positive, not {total_bytes}")
    allowed = max(0, budget_bytes - max(0, outside_bytes))
    return min(1.0, allowed / total_bytes)


def outside_allocator_bytes(free_bytes: int, total_bytes: int, reserved_bytes: int) -> int:
    """Pure: memory in use on the card that this process's allocator did not reserve.

    Read where no other process uses the card (a trial's GPU), this is the process's own
    context, library handles and kernels. Other processes' memory counts here too: on a
    shared card they take memory from the trial as much.
    """
    return max(0, total_bytes - free_bytes - reserved_bytes)


def initialise(torch, device) -> None:
    """CUDA's lazy initialisation (the allocator parses its setting here) and the trial's device."""
    torch.cuda.init()
    torch.cuda.set_device(device)


def warm_up(torch, device, precision: str) -> None:
    """A tiny matmul and a convolution forward and backward in the trial's dtype: the libraries' memory, now."""
    tensor_name, autocast_name = _WARM_UP_DTYPES[precision]
    dtype = getattr(torch, tensor_name)
    a = torch.randn(64, 64, device=device, dtype=dtype, requires_grad=True)
    x = torch.randn(2, 3, 16, 16, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(8, 3, 3, 3, device=device, dtype=dtype, requires_grad=True)
    if autocast_name is None:
        import contextlib

        context = contextlib.nullcontext()
    else:
        context = torch.autocast("cuda", dtype=getattr(torch, autocast_name))
    with context:
        total = (a @ a).float().sum() + torch.nn.functional.conv2d(x, w, padding=1).float().sum()
    total.backward()
    torch.cuda.synchronize(device)
    del a, x, w, total


def setup(torch, device, precision: str, budget_bytes: int | None) -> dict[str, Any]:
    """Initialise, warm up, apply the budget; return the ``TrialResult`` fields this sets."""
    initialise(torch, device)
    warm_up(torch, device, precision)
    free, total = torch.cuda.mem_get_info(device)
    if budget_bytes:
        outside = outside_allocator_bytes(free, total, torch.cuda.memory_reserved(device))
        torch.cuda.set_per_process_memory_fraction(budget_fraction(budget_bytes, total, outside), device)
    return {"total_memory_bytes": total}


def allocator_backend(torch) -> str:
    """'native' (the caching allocator) or 'cudaMallocAsync'."""
    try:
        return torch.cuda.memory.get_allocator_backend()
    except Exception:  # an allocator that cannot say: treat it as torch's own
        return "native"


def allocator_need(reserved_peak: int, allocated_peak: int, split_peak: int | None, asynchronous: bool) -> int:
    """Pure: the bytes the allocator needed for the trial, in the units its cap counts (see the module's docstring).

    Native: the allocated peak plus the peak of free space inside used segments (``inactive_split_bytes``), never
    above the reserved peak (which holds both); without that statistic, the reserved peak. cudaMallocAsync: the
    allocated peak (the fraction caps bytes in use there; its reserved peak is the pool's high-water mark).
    """
    if asynchronous:
        return allocated_peak
    if split_peak is None:
        return reserved_peak
    return min(reserved_peak, allocated_peak + split_peak)


def card_reading(torch, device) -> dict[str, int]:
    """The trial's readings now, in the budget's units: ``budget_peak_bytes`` (the allocator's need so far plus
    what lies outside it now), with the parts it is made of. Read after every step and at the end: one function,
    so the steps and the verdict compare the same thing whichever allocator runs."""
    free, total = torch.cuda.mem_get_info(device)
    reserved = torch.cuda.memory_reserved(device)
    reserved_peak = torch.cuda.max_memory_reserved(device)
    allocated_peak = torch.cuda.max_memory_allocated(device)
    stats = _stats(torch, device)
    asynchronous = allocator_backend(torch) == "cudaMallocAsync"
    need = allocator_need(reserved_peak, allocated_peak, stats.get("inactive_split_bytes.all.peak"), asynchronous)
    outside = outside_allocator_bytes(free, total, reserved)
    return {"reserved_peak": reserved_peak, "allocated_peak": allocated_peak, "need": need, "outside": outside,
            "budget_peak_bytes": need + outside, "retries": int(stats.get("num_alloc_retries", 0)),
            "held": torch.cuda.memory_allocated(device)}


def _stats(torch, device) -> dict:
    try:
        return dict(torch.cuda.memory_stats(device))
    except Exception:  # an allocator without statistics: the reserved peak stands for the need
        return {}


def step_readings(torch, device) -> dict[str, int]:
    """After a step (``protocol.StepDone`` fields): the reserved peak so far, what is held now, and the budget's
    reading (``card_reading``)."""
    reading = card_reading(torch, device)
    return {"peak_bytes": reading["reserved_peak"], "held_bytes": reading["held"],
            "budget_peak_bytes": reading["budget_peak_bytes"]}


def readings(torch, device, sizes, step_budget_peak: int | None = None) -> dict[str, Any]:
    """The trial's CUDA readings after its steps (``TrialResult`` fields), ``sizes`` completed.

    ``budget_peak_bytes`` is in the budget's units (``card_reading``): never below what a step already read
    (``step_budget_peak``), since memory outside the allocator can be read lower at the end than at a step.
    """
    reading = card_reading(torch, device)
    budget_peak = max(reading["budget_peak_bytes"], step_budget_peak or 0)
    sizes = sizes.model_copy(update={
        "cuda_context_bytes": reading["outside"],
        "reserved_unallocated_bytes": max(0, reading["reserved_peak"] - reading["allocated_peak"]),
    })
    return {
        "sizes": sizes,
        "peak_allocated_bytes": reading["allocated_peak"],
        "peak_bytes": reading["reserved_peak"],
        "budget_peak_bytes": budget_peak,
        "alloc_retries": reading["retries"],
        # Weights, gradients and optimizer state, with the batch's activations freed, plus what lies outside the
        # allocator: the budget's units, a little below the line's intercept (allocated, not reserved).
        "base_bytes": reading["held"] + reading["outside"],
    }


def memory_at_failure(torch, device) -> dict[str, int] | None:
    """The card as the failure left it (``result.CudaMemoryAtFailure`` fields), or None if CUDA cannot say.

    Read before the failed step's tensors are collected: the evidence for an ambiguous library
    error when there is no budget to re-run under (``pipeline.trials``). The allocator's cache
    (reserved, not allocated) is free to a library that asks the allocator, which releases it and
    retries: ``report.outcomes.free_at_failure`` counts it as free.
    """
    try:
        free, total = torch.cuda.mem_get_info(device)
        return {"free_bytes": int(free), "total_bytes": int(total),
                "reserved_bytes": int(torch.cuda.memory_reserved(device)),
                "allocated_bytes": int(torch.cuda.memory_allocated(device))}
    except Exception:  # a context broken by the failure itself: no evidence, the error stands
        return None


def allocator_setting_problem(torch, setting: str) -> str | None:
    """Why torch rejects an allocator setting, or None. Parsed only: no device, no allocation.

    torch's own parser (``_accelerator_setAllocatorSettings``) answers for every key except
    ``backend``, which cannot change once the process has chosen one (torch raises an internal
    assert for a different one): that key's value is checked here against torch's two.
    """
    rest = []
    for token in setting.split(","):
        key, _, value = token.partition(":")
        if key.strip() == "backend":
            if value.strip() not in ("native", "cudaMallocAsync"):
                return f"backend must be native or cudaMallocAsync, not {value.strip()!r}"
        elif token.strip():
            rest.append(token.strip())
    if not rest:
        return None
    parse = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
    try:
        parse(",".join(rest))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
