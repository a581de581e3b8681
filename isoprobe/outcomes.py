"""How a trial ended, and how to tell an out-of-memory failure from everything else.

Shared by the child (which classifies its own exception), the probe (which
adds crashed and timed out) and the search (which only moves on fits and
out_of_memory). Plain Python on purpose: the child imports it before torch, and
the classifier is tested with strings, without torch.
"""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """The five ways a trial ends. Only FITS counts as success; unknown is never FITS."""

    FITS = "fits"                    # every training step completed and the child reported it
    OUT_OF_MEMORY = "out_of_memory"  # an allocation failed (CUDA OOM, CPU allocator under the cap)
    ERROR = "error"                  # any other exception: a bug in the model or spec, not a memory verdict
    CRASHED = "crashed"              # killed by a signal, or exited without a complete result
    TIMED_OUT = "timed_out"          # ran past the trial timeout; its process group was killed


class StopReason(str, enum.Enum):
    """Why a probe ended; decides the exit code (``result.exit_code_for``).

    The search ends with one of the first six; the probe adds the two
    interrupts. One enumeration for both, so a search's stop is the result's.
    """

    EDGE_FOUND = "edge_found"                  # max fits (every time) and max + 1 fails
    CAPPED = "capped"                          # the largest allowed batch fits (every time); see ``limited_by``
    START_DOES_NOT_FIT = "start_does_not_fit"  # not even the start batch fits
    ERROR = "error"                            # a trial raised a non-memory exception (a bug, not a verdict)
    CRASHED = "crashed"                        # nothing fits, and the start batch's verdict is crashed
    TIMED_OUT = "timed_out"                    # nothing fits, and the start batch's verdict is timed out
    INTERRUPTED = "interrupted"                # SIGINT (Ctrl-C)
    TERMINATED = "terminated"                  # SIGTERM


#: Substrings of exception messages that mean an allocation failed. Checked
#: case-insensitively. Sources: torch's CUDA caching allocator ("CUDA out of
#: memory"), raw CUDA/cuBLAS/cuDNN status codes surfaced as RuntimeError, and
#: c10's DefaultCPUAllocator ("can't allocate memory ... Error code 12").
_OOM_MESSAGE_MARKERS = (
    "out of memory",
    "can't allocate memory",
    "cannot allocate memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudaerrormemoryallocation",
    "failed to allocate memory",
)

#: Exception class names (anywhere in the MRO) that are allocation failures by type.
_OOM_TYPE_NAMES = {"OutOfMemoryError", "MemoryError", "_ArrayMemoryError"}


def classify_exception(type_names: list[str], message: str) -> Outcome:
    """OUT_OF_MEMORY when the type or the message says an allocation failed, else ERROR.

    ``type_names`` is the class names of the exception's MRO (``type(e).__mro__``)
    so subclasses such as torch.OutOfMemoryError or numpy's _ArrayMemoryError
    are recognised by name without importing either library.
    """
    if any(name in _OOM_TYPE_NAMES for name in type_names):
        return Outcome.OUT_OF_MEMORY
    lowered = message.lower()
    if any(marker in lowered for marker in _OOM_MESSAGE_MARKERS):
        return Outcome.OUT_OF_MEMORY
    return Outcome.ERROR


#: Library errors that *may* hide a failed allocation but also have other causes, so
#: their message alone decides nothing. oneDNN (CPU convolutions) reports a failed
#: scratchpad allocation as "could not create a primitive" (measured here: a small
#: CNN failed so at batch 140 under a 1.25 GiB cap and fit at 140 under 3 GiB);
#: cuDNN can report a failed workspace allocation as an internal error. C++ code
#: inside torch reports a failed ``new`` as "std::bad_alloc" (measured here:
#: MobileNetV3 with fp16 autocast at batch 27 under a 1.5 GiB cap), but a size
#: computed from a bug fails the same way, so it too needs the re-run. oneDNN also
#: fails mid-run as "could not execute a primitive" (measured here: DeepLabV3 with
#: bf16 autocast at batch 3 under a 3 GiB cap).
_AMBIGUOUS_MARKERS = (
    "could not create a primitive",
    "could not execute a primitive",
    "cudnn_status_internal_error",
    "std::bad_alloc",
)


def maybe_allocation_failure(message: str) -> bool:
    """True for errors that need evidence (a re-run with more memory) before they count as out of memory."""
    lowered = message.lower()
    return any(marker in lowered for marker in _AMBIGUOUS_MARKERS)
