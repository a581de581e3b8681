"""A command trial's CUDA budget and readings, inside the user's process: the shim's CUDA half.

Loaded by path by ``_isoprobe_shim`` (standard library only; handed ``torch.cuda`` and
``isoprobe.child.cuda_readings``, also loaded by path). The budget means what it means in isoprobe's own trials: what
the process may hold of the card, its context and libraries included. So:

- **Applied from before the first allocation, where torch allows it without a context.** ``torch.cuda._lazy_call``
  queues a call that CUDA's lazy initialisation runs right after ``torch._C._cuda_init()`` (torch/cuda/__init__.py,
  ``_lazy_init``), which every first CUDA tensor goes through, and which creates the caching allocator of every device
  (``NativeCachingAllocator::init``) but no context. From torch 2.10 the native allocator's ``setMemoryFraction``
  caps against ``device_prop.totalGlobalMem``, read in the allocator's constructor: no context, so every device is
  capped there. Before 2.10 it calls ``SetDevice`` and ``cudaMemGetInfo`` (``cuda_readings.fraction_creates_context``):
  capping every device would create a context on every visible GPU in every rank and leave the last one current, so
  a device is capped when it first shows use (after a step), under ``torch.cuda.device``'s guard, which puts the
  current device back without creating a context there. Under ``backend:cudaMallocAsync`` ``setMemoryFraction``
  takes a ``CUDAGuard`` and asks ``cudaMemGetInfo`` in every release: the same per-device path. Until a device is
  capped, the supervisor's judging of every step's reading against the budget is the limit.
- **The memory outside the allocator is taken off**: the estimate the supervisor passes, then what each step reads
  on the device (this process's own, ``cuda_readings.outside_allocator_bytes``), when more: lazily loaded kernels and
  NCCL's buffers come after the start.
- **A script's own ``set_per_process_memory_fraction(f)``** is honoured on the emulated card, which is the budget: f
  of the budget (never above the budget less the outside memory); ``get_per_process_memory_fraction`` answers its f,
  where the installed torch has that function (2.6 on).
- **Only the devices the process uses are read and capped**: a device whose allocator reserved memory
  (``max_memory_reserved(d) > 0``: ``THCPModule_memoryStats`` reads the allocator's counters, no CUDA call, and
  torch returns {} before CUDA is initialised), never ``current_device()``, which a DDP rank that placed its model
  with ``.to(f"cuda:{rank}")`` leaves at 0.
- **A cap that left out less than came outside the allocator later is lowered, and that step's reading is no
  verdict** (``cap_lowered``): the model's kernels load lazily at their first use (2 MiB on an H200, docs/gpu.md),
  and a batch whose allocator reached the loose cap read that much over the budget, where a card with only the
  budget free trained it. The device's peak statistics restart there (the one statistic of the script's that
  this changes, once, when its kernels come), and the supervisor judges the next step.
- **Retries from the first training forward**: ``num_alloc_retries`` accumulates from the process's start, and the
  script's model build is not the batch's; the count when the first forward began is taken off (the script's own
  statistics are not reset).
"""

import sys

#: typing's flag without importing typing into the user's process (annotations here are strings: never evaluated).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_state: "dict[str, Any]" = {
    "cuda": None,
    "readings": None,
    "set_fraction": None,
    "budget": None,
    "outside": {},
    "outside_estimate": 0,
    "script_fractions": {},
    "budget_peaks": {},
    "capped": set(),
    "at_init": False,
    "retries_from": None,
}


def install(cuda, budget, outside_estimate, readings, torch_version):
    """With a budget: cap the devices (see the module's docstring) and honour the script's own fractions inside the
    budget. Nothing without a budget, without torch.cuda, or when already installed."""
    if budget is None or cuda is None or _state["cuda"] is not None:
        return
    _state.update(
        cuda=cuda,
        readings=readings,
        budget=budget,
        set_fraction=cuda.set_per_process_memory_fraction,
        outside_estimate=max(0, outside_estimate or 0),
        at_init=not readings.fraction_creates_context(torch_version),
    )
    ask_fraction = getattr(cuda, "get_per_process_memory_fraction", None)  # torch 2.6 on

    def set_per_process_memory_fraction(fraction, device=None):
        if not isinstance(fraction, float) or not 0 <= fraction <= 1:
            return _state["set_fraction"](fraction, device)  # torch's own error, as without the shim
        index = _device_index(cuda, device)
        _state["script_fractions"][index] = fraction
        _cap(cuda, index)

    def get_per_process_memory_fraction(device=None):
        ask_fraction(device)  # torch's own checks and initialisation
        return _state["script_fractions"].get(_device_index(cuda, device), 1.0)

    set_per_process_memory_fraction.__doc__ = _state["set_fraction"].__doc__
    for owner in (cuda, getattr(cuda, "memory", None)):
        if owner is not None and getattr(owner, "set_per_process_memory_fraction", None) is _state["set_fraction"]:
            owner.set_per_process_memory_fraction = set_per_process_memory_fraction
        if (
            ask_fraction is not None
            and owner is not None
            and getattr(owner, "get_per_process_memory_fraction", None) is ask_fraction
        ):
            get_per_process_memory_fraction.__doc__ = ask_fraction.__doc__
            owner.get_per_process_memory_fraction = get_per_process_memory_fraction
    cuda._lazy_call(_at_cuda_init)


def _at_cuda_init():
    """Run by CUDA's lazy initialisation, before any allocation: every device's cap, where that creates no context."""
    cuda = _state["cuda"]
    try:
        if not _state["at_init"] or _state["readings"].allocator_backend(cuda) != "native":
            return
        for index in range(cuda.device_count()):
            _cap(cuda, index)
    except Exception as exc:  # never into the script's first CUDA call: the supervisor still judges every reading
        sys.stderr.write(f"isoprobe shim: cannot cap the CUDA allocator ({type(exc).__name__}: {exc})\n")


def _cap(cuda, index):
    total = cuda.get_device_properties(index).total_memory
    outside = _cap_outside(index)
    script_fraction = _state["script_fractions"].get(index)
    fraction = (
        _state["readings"].budget_fraction(_state["budget"], total, outside, script_fraction) if total > 0 else 1.0
    )
    guard = getattr(cuda, "device", None)  # torch.cuda.device: the current device put back on leaving
    if _state["at_init"] or not callable(guard):
        _state["set_fraction"](float(fraction), index)
    else:
        with guard(index):
            _state["set_fraction"](float(fraction), index)
    _state["capped"].add(index)


def _cap_outside(index):
    """The memory outside the allocator the device's cap left out."""
    return max(_state["outside_estimate"], _state["outside"].get(index, 0))


def _device_index(cuda, device):
    if device is None:
        return cuda.current_device()
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if isinstance(index, int):
        return index
    text = str(device)
    return int(text.split(":", 1)[1]) if ":" in text else cuda.current_device()


def used_devices(cuda):
    """The devices whose allocator reserved memory in this process (a context exists there): no other is asked."""
    used = []
    for index in range(cuda.device_count()):
        try:
            if cuda.max_memory_reserved(index) > 0:
                used.append(index)
        except Exception:
            continue
    return used


def forward_began(cuda):
    """The first training forward: each used device's retries so far are the script's set-up, not the batch's."""
    if _state["retries_from"] is not None or cuda is None:
        return
    _state["retries_from"] = {}
    for index in used_devices(cuda):
        try:
            _state["retries_from"][index] = int(dict(cuda.memory_stats(index)).get("num_alloc_retries", 0))
        except Exception:
            continue


def memory(cuda, readings):
    """The step's readings of the worst device the process uses (``ShimStep``'s CUDA fields), or None."""
    worst = None
    for index in used_devices(cuda):
        cuda.synchronize(index)
        reading = readings.card_reading(cuda, index)
        peak = max(reading["budget_peak_bytes"], _state["budget_peaks"].get(index, 0))  # never below a step's
        _state["budget_peaks"][index] = peak
        lowered = False
        if _state["budget"] is not None and (reading["outside"] > _cap_outside(index) or index not in _state["capped"]):
            lowered = index in _state["capped"]  # a cap that left out less than is outside now: too loose
            _state["outside"][index] = max(reading["outside"], _state["outside"].get(index, 0))
            _cap(cuda, index)  # a device in use now, or what came outside the allocator since, is capped
            if lowered:  # this step ran under the loose cap: its reading is not a verdict, the next step's is
                cuda.reset_peak_memory_stats(index)
                _state["budget_peaks"][index] = 0
        retries = reading["retries"] - (_state["retries_from"] or {}).get(index, 0)
        line = {
            "peak_bytes": reading["reserved_peak"],
            "held_bytes": reading["held"],
            "budget_peak_bytes": peak,
            "held_budget_bytes": reading["held"] + reading["outside"],
            "peak_allocated_bytes": reading["allocated_peak"],
            "outside_bytes": reading["outside"],
            "alloc_retries": max(0, retries),
            "device": f"cuda:{index}",
        }
        if index in _state["script_fractions"]:
            line["script_memory_fraction"] = _state["script_fractions"][index]
        if lowered:
            line["cap_lowered"] = True
        if worst is None or peak > worst["budget_peak_bytes"]:
            worst = line
    return worst
