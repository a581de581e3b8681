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
- **The budget, the readings and the allocator's need** are ``child.cuda_readings``'s (one
  implementation, which the step reports and a command's shim use too): the fraction is computed
  after the warm-up, with what the process then holds outside the allocator taken off the budget.
- **The cap follows what comes outside the allocator later** (``refit_cap``, after every step): the model's
  own kernels load lazily at their first use, after the warm-up. Measured on an H200 (docs/gpu.md, torch 2.11):
  2 MiB came after the fraction was set, so every batch whose allocator reached the cap read 2 MiB over the
  budget and was called out of memory, where a card with only the budget free trained it (ResNet50 under 8 GiB:
  75 and 76 trained there; isoprobe said 74). The cap is lowered as soon as a step shows more outside, and the
  steps before it, run under a cap that was too loose, no longer count.
- **A peak within the spread of the capacity is tested, not read** (``squeeze``): near the cap the allocator
  frees its cache and retries, so its reading is the cap's, whatever the batch needs. Such a trial runs its steps
  again under a cap the spread lower: if they fit, the batch leaves the spread free by test, and those steps are
  its readings.
"""

from __future__ import annotations

from typing import Any

from isoprobe.child.cuda_readings import (  # noqa: F401 - the readings' one home, named here too
    allocator_backend,
    allocator_need,
    budget_fraction,
    card_reading,
    outside_allocator_bytes,
    outside_now,
    own_process_bytes,
    step_readings,
)

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


#: The cap set on each device of this process (``setup``): the budget and the memory outside the allocator the
#: fraction was computed with, so that a step can lower it (``refit_cap``). Keyed by ``str(device)``.
_CAPS: dict[str, dict[str, int]] = {}

#: The caching allocator's rounding of a large segment (``kRoundLarge``): a squeezed cap leaves this much below the
#: line, so that a reading under it clears the spread strictly.
GRANULE_BYTES = 2 << 20


def setup(torch, device, precision: str, budget_bytes: int | None) -> dict[str, Any]:
    """Initialise, warm up, apply the budget; return the ``TrialResult`` fields this sets."""
    initialise(torch, device)
    warm_up(torch, device, precision)
    outside, total = outside_now(torch.cuda, device)
    if budget_bytes:
        torch.cuda.set_per_process_memory_fraction(budget_fraction(budget_bytes, total, outside), device)
        _CAPS[str(device)] = {"budget": budget_bytes, "outside": outside}
    return {"total_memory_bytes": total}


def refit_cap(torch, device, reset_peaks: bool) -> bool:
    """After a step: lower the cap by what came outside the allocator since it was set (see the module's docstring);
    True when it did. ``reset_peaks``: the peaks restart under the new cap (the loop runs another step to read
    them); a loop that cannot step again keeps them, and a reading above the budget stays the verdict."""
    cap = _CAPS.get(str(device))
    if cap is None:
        return False
    outside, total = outside_now(torch.cuda, device)
    if outside <= cap["outside"]:
        return False
    cap["outside"] = outside
    torch.cuda.set_per_process_memory_fraction(budget_fraction(cap["budget"], total, outside), device)
    if reset_peaks:
        torch.cuda.reset_peak_memory_stats(device)
    return True


def squeeze(torch, device, check_at_bytes: int, run_steps) -> bool:
    """Run ``run_steps`` under a cap that leaves the reading below ``check_at_bytes`` (the capacity less the spread,
    in the budget's units), with the peaks restarted: True when they fit there and ``run_steps`` says they held
    still (their peaks are then the trial's readings); False when they did not, or the allocator ran out of memory
    (the cap is put back and the trial's earlier readings stand). Any other error is the trial's."""
    outside, total = outside_now(torch.cuda, device)
    cap = _CAPS.get(str(device))
    before = budget_fraction(cap["budget"], total, cap["outside"]) if cap else 1.0
    allowed = max(0, check_at_bytes - GRANULE_BYTES - outside)
    torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total), device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        held_still = bool(run_steps())
        torch.cuda.synchronize(device)
        return held_still
    except torch.OutOfMemoryError:
        return False
    finally:
        torch.cuda.set_per_process_memory_fraction(before, device)


def start_counting(torch, device) -> None:
    """The trial's readings from here on: the peaks (the weights, allocated already, still count) and the
    allocator's retries and out-of-memory counts, which accumulate from the process's start
    (``resetPeakStats`` leaves ``num_alloc_retries`` alone; ``resetAccumulatedStats`` zeroes it): counted from the
    start, a retry while the model was built read as the batch's."""
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.reset_accumulated_memory_stats(device)


def readings(torch, device, sizes, step_budget_peak: int | None = None) -> dict[str, Any]:
    """The trial's CUDA readings after its steps (``TrialResult`` fields), ``sizes`` completed.

    ``budget_peak_bytes`` is in the budget's units (``card_reading``): never below what a step already read
    (``step_budget_peak``), since memory outside the allocator can be read lower at the end than at a step.
    """
    reading = card_reading(torch.cuda, device)
    budget_peak = max(reading["budget_peak_bytes"], step_budget_peak or 0)
    sizes = sizes.model_copy(
        update={
            "cuda_context_bytes": reading["outside"],
            "reserved_unallocated_bytes": max(0, reading["reserved_peak"] - reading["allocated_peak"]),
        }
    )
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
        return {
            "free_bytes": int(free),
            "total_bytes": int(total),
            "reserved_bytes": int(torch.cuda.memory_reserved(device)),
            "allocated_bytes": int(torch.cuda.memory_allocated(device)),
        }
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
