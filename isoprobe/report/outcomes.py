"""How a trial ended, and how to tell an out-of-memory failure from everything else.

Shared by the child (which classifies its own exception), the probe (which
adds crashed and timed out) and the search (which only moves on fits and
out_of_memory). Plain Python on purpose: the child imports it before torch, and
the classifier is tested with strings, without torch.
"""

from __future__ import annotations

import enum
import errno
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from isoprobe.errors import ExitCode


# What each outcome means to the search, the report and the exit code is declared once, in ``MEANINGS`` below
# (``outcome.meaning``): a new member needs an entry there, and nowhere else decides by its name. (Said here, not in
# the docstring: that is the published schemas' description, which stays as it is.)
class Outcome(str, enum.Enum):
    """The six ways a trial ends. Only FITS counts as success; unknown is never FITS."""

    FITS = "fits"  # every training step completed and the child reported it
    OUT_OF_MEMORY = "out_of_memory"  # an allocation failed (CUDA OOM, CPU allocator under the cap)
    ERROR = "error"  # any other exception: a bug in the model or spec, not a memory verdict
    CRASHED = "crashed"  # killed by a signal, or exited without a complete result
    TIMED_OUT = "timed_out"  # ran past the trial timeout; its process group was killed
    STILL_RISING = "still_rising"  # a deciding trial ran every step, its peak still rising at the cap (steady.py)

    @property
    def meaning(self) -> Meaning:
        """What this outcome means everywhere a decision is taken on it (``MEANINGS``)."""
        return MEANINGS[self]


class StopReason(str, enum.Enum):
    """Why a probe ended; decides the exit code (``result.exit_code_for``).

    The search ends with one of the first seven; the probe adds the two
    interrupts; the command adds the stops that come before or outside the
    search (a bad spec, isoprobe's own bug), so that every stop of ``isoprobe run``
    prints one document. One enumeration for all, so a search's stop is the result's.
    """

    EDGE_FOUND = "edge_found"  # max fits (every time) and max + 1 fails
    CAPPED = "capped"  # the largest allowed batch fits (every time); see ``limited_by``
    START_DOES_NOT_FIT = "start_does_not_fit"  # not even the start batch fits
    ERROR = "error"  # a trial raised a non-memory exception (a bug, not a verdict), or the
    # probe could not go on (ProbeError: the environment check failed, the
    # system refused what a trial needs, Slurm lost a node's step daemon)
    CRASHED = "crashed"  # nothing fits, and the start batch's verdict is crashed
    TIMED_OUT = "timed_out"  # nothing fits, and the start batch's verdict is timed out
    STILL_RISING = "still_rising"  # no batch holds the long run: down to 1, each one's peak kept rising
    INTERRUPTED = "interrupted"  # SIGINT (Ctrl-C)
    TERMINATED = "terminated"  # SIGTERM (a Slurm job's time limit, scancel, a node lost)
    BAD_SPEC = "bad_spec"  # the spec or an override cannot be used: no probe ran (exit 2)
    INTERNAL_ERROR = "internal_error"  # a bug in isoprobe itself stopped the probe (exit 1)


@dataclass(frozen=True)
class PlotStyle:
    """How ``isoprobe plot`` draws a trial that ended so: matplotlib's marker and colour, and the legend's words."""

    marker: str
    colour: str
    label: str


@dataclass(frozen=True)
class Meaning:
    """What one outcome means to every part of isoprobe that decides on it, declared once (issue 58).

    Before this, each site kept its own list of outcomes (the search's verdicts and bounds, the conclusion's stop,
    the plot's styles, the message's words, the exit codes): a class added in one place fell into another's
    default, and ``still_rising`` trials were counted as failed but never drawn. Every site reads this instead,
    and ``tests/unit/test_outcome_table.py`` fails for a member without a complete entry.
    """

    #: The trial fit: only FITS. Every other outcome is a failure of the batch, and unknown is never a fit.
    fits: bool
    #: The failure says the batch needs more memory than it had (it ran out, or its peak never held still): the
    #: edge is memory. A failure without it may bound the search, but "not proven to be memory".
    memory_verdict: bool
    #: An allocation failed in the trial itself: a failure observed at that batch, not a judgement of the long run
    #: (still rising). The token search's only bound (``search.token_budget``): a failure there stands for a whole
    #: quadrant of counts and lengths, and any other outcome stops it without a budget rather than guess.
    allocation_failed: bool
    #: One trial that ended so ends the search at once, without an answer (an error: a bug, not a verdict), and it
    #: is never a bound: a batch judged so neither raises nor lowers the bracket.
    stops_search: bool
    #: No verdict on the batch yet: a process died, not why; the batch runs again in a fresh process (up to
    #: ``Limits.retries``) before the failure counts (``history.verdicts``).
    retried: bool
    #: One such failure next to a fit, in a fresh process, is set aside until another run reproduces it
    #: (``history.not_reproduced``): a node's hiccup says nothing about the batch.
    must_reproduce: bool
    #: Which failure decides a batch whose attempts failed in several ways: the lowest number among the attempts'
    #: classes that are not ``retried`` (an error before out of memory before still rising). None for the retried
    #: classes (their last failure decides once the retries are spent) and for FITS.
    precedence: int | None
    #: How a search stops when it ends on this outcome without a fitting batch (a batch search whose smallest
    #: failure failed so, or a token search stopped by it). None for FITS: a fit ends in edge_found or capped.
    stop: StopReason | None
    #: The exit code that outcome leads to (``result.exit_code_for`` of ``stop``; FITS: an answer).
    exit_code: ExitCode
    #: How ``isoprobe plot`` draws it (a failure at the capacity line: it has no peak to show).
    plot: PlotStyle
    #: How a message names a batch that ended so, after its number ("batch 33 runs out of memory").
    prose: str


#: Every outcome's meaning: the one declaration the search (``search.history``, ``search.edge_search``,
#: ``search.steps``, ``search.token_budget``), the classification (``pipeline.classify``), the messages
#: (``pipeline.explain``), the plot (``report.plot``) and the exit codes (``report.result``) read. Read-only.
MEANINGS: Mapping[Outcome, Meaning] = MappingProxyType(
    {
        Outcome.FITS: Meaning(
            fits=True,
            memory_verdict=False,
            allocation_failed=False,
            stops_search=False,
            retried=False,
            must_reproduce=False,
            precedence=None,
            stop=None,
            exit_code=ExitCode.ANSWERED,
            plot=PlotStyle("o", "tab:blue", "fits: peak memory"),
            prose="fits",
        ),
        Outcome.ERROR: Meaning(
            fits=False,
            memory_verdict=False,
            allocation_failed=False,
            stops_search=True,
            retried=False,
            must_reproduce=False,
            precedence=0,
            stop=StopReason.ERROR,
            exit_code=ExitCode.NO_ANSWER,
            plot=PlotStyle("D", "dimgray", "error (not a memory verdict)"),
            prose="error (counted as failing; not proven to be memory)",
        ),
        Outcome.OUT_OF_MEMORY: Meaning(
            fits=False,
            memory_verdict=True,
            allocation_failed=True,
            stops_search=False,
            retried=False,
            must_reproduce=False,
            precedence=1,
            stop=StopReason.START_DOES_NOT_FIT,
            exit_code=ExitCode.START_DOES_NOT_FIT,
            plot=PlotStyle("x", "tab:red", "out of memory"),
            prose="runs out of memory",
        ),
        Outcome.STILL_RISING: Meaning(
            fits=False,
            memory_verdict=True,
            allocation_failed=False,  # every step ran: its peak was still rising, no allocation failed
            stops_search=False,
            retried=False,  # it ran every step: no retry can tell more
            must_reproduce=False,
            precedence=2,
            stop=StopReason.STILL_RISING,
            exit_code=ExitCode.NO_ANSWER,
            plot=PlotStyle("^", "tab:pink", "still rising at the step cap"),
            prose="is still rising at the step cap (search.steady_steps)",
        ),
        Outcome.CRASHED: Meaning(
            fits=False,
            memory_verdict=False,
            allocation_failed=False,
            stops_search=False,
            retried=True,
            must_reproduce=True,
            precedence=None,
            stop=StopReason.CRASHED,
            exit_code=ExitCode.NO_ANSWER,
            plot=PlotStyle("v", "tab:purple", "crashed"),
            prose="crashed (counted as failing; not proven to be memory)",
        ),
        Outcome.TIMED_OUT: Meaning(
            fits=False,
            memory_verdict=False,
            allocation_failed=False,
            stops_search=False,
            retried=True,
            must_reproduce=True,
            precedence=None,
            stop=StopReason.TIMED_OUT,
            exit_code=ExitCode.NO_ANSWER,
            plot=PlotStyle(">", "tab:brown", "timed out"),
            prose="timed_out (counted as failing; not proven to be memory)",
        ),
    }
)


#: Exception class names (anywhere in the MRO) that are allocation failures by type: torch's
#: OutOfMemoryError (c10::OutOfMemoryError, raised by the CUDA caching allocator and its kin),
#: Python's MemoryError and its subclasses (numpy's _ArrayMemoryError).
_OOM_TYPE_NAMES = {"OutOfMemoryError", "MemoryError", "_ArrayMemoryError"}

#: NCCL's own cudaMalloc failing (its buffers, connected per algorithm on first use, outside the allocator):
#: NCCL's CUDACHECK writes "Cuda failure %d '%s'" with cudaErrorMemoryAllocation (2) and its string, and torch
#: raises it as a DistBackendError (a RuntimeError) under "ncclUnhandledCudaError: Call to CUDA function failed.",
#: or, from its watchdog, prints it before it aborts the rank (SIGABRT, no exception line). Lower case.
_NCCL_OOM_MESSAGES = (
    "cuda failure 2 'out of memory'",
    "cuda failure 'out of memory'",  # NCCL releases whose CUDACHECK leaves the number out
)

#: Where torch reports a failed allocation as a plain RuntimeError (or a subclass), the allocator's
#: own wording, compared case-insensitively. Read from the installed torch 2.14 (``strings`` on
#: torch/lib/*.so, headers under torch/include, the bundled nvidia libraries), not guessed:
_ALLOCATOR_MESSAGES = (
    "cuda out of memory",  # libc10_cuda: the caching allocator (RuntimeError before 2.x)
    "cuda error: out of memory",  # C10_CUDA_CHECK: cudaErrorMemoryAllocation (libcudart's text)
    "cudaerrormemoryallocation",  # libtorch_cuda: the status by name
    "cuda ran out of memory outside pytorch's allocator",  # libtorch_cuda: cuDNN's own allocations
    "defaultcpuallocator: can't allocate memory",  # libc10: the CPU allocator (what the CPU cap makes fail)
    "c10 out of memory",  # libc10: "C10 Out of Memory. Trying to allocate ..."
    "unable to mmap memory",  # libtorch_cpu: "Torch: unable to mmap memory: you tried ..."
    "cannot allocate memory",  # strerror(ENOMEM), appended by torch to a failed mmap/alloc
    "cublas_status_alloc_failed",  # ATen/cuda/Exceptions.h: "CUDA error: " + the cuBLAS status
    "cusolver_status_alloc_failed",  # libtorch_cuda
    "cusparse_status_alloc_failed",  # libcusparse's status string
    "cufft_alloc_failed",  # libtorch_cuda
    "cudnn_status_alloc_failed",  # "cuDNN error: " + the status (cuDNN 8's name)
    "cudnn_status_internal_error_host_allocation_failed",  # libcudnn_graph.so.9 (cuDNN 9's names)
    "cudnn_status_internal_error_device_allocation_failed",
    *_NCCL_OOM_MESSAGES,
)

#: The allocators' wording as they print it (case as printed), judged in the error a process's stderr ended with
#: (``ending_error``) when no exception line came (C++ code, a rank whose excepthook the script replaced, a script
#: that printed the error it caught). The types above count there only as an exception's own line names them
#: (``_TYPE_LINE``): at the start of a line, as a traceback's last line and ``print(f"{type}: {e}")`` write them, or as
#: C++'s terminate names what it caught.
_LAST_WORDS_MARKERS = ("DefaultCPUAllocator: can't allocate memory", "CUDA out of memory")
_OOM_TYPES = "|".join(sorted(_OOM_TYPE_NAMES))
_TYPE_LINE = re.compile(
    rf"^(?:[\w.]+\.)?(?:{_OOM_TYPES})(?::|$)|instance of '(?:\w+::)*(?:{_OOM_TYPES})'", re.MULTILINE
)

#: An OSError with this errno is the kernel refusing memory: mmap, fork, or brk under the CPU cap
#: (measured: ``mmap.mmap(-1, n, flags=MAP_PRIVATE)`` above RLIMIT_DATA raises "[Errno 12] Cannot
#: allocate memory").
_ENOMEM_PREFIX = f"[Errno {errno.ENOMEM}]"


def classify_exception(type_names: list[str], message: str) -> Outcome:
    """OUT_OF_MEMORY when the type, or an allocator's own wording on its own type, says an allocation failed.

    ``type_names`` is the class names of the exception's MRO (``type(e).__mro__``)
    so subclasses such as torch.OutOfMemoryError or numpy's _ArrayMemoryError
    are recognised by name without importing either library. A message counts
    only on the type the allocators raise (RuntimeError and its subclasses; an
    OSError for ENOMEM): a ValueError, KeyError or any other exception is a bug
    in the model whatever its message says, such as "the loader ran out of
    memory-mapped records". Loose text ("out of memory" anywhere) once made such
    a bug an out-of-memory verdict, a false edge with exit 0.
    """
    if any(name in _OOM_TYPE_NAMES for name in type_names):
        return Outcome.OUT_OF_MEMORY
    lowered = message.lower()
    if "RuntimeError" in type_names and any(marker in lowered for marker in _ALLOCATOR_MESSAGES):
        return Outcome.OUT_OF_MEMORY
    if "OSError" in type_names and message.startswith(_ENOMEM_PREFIX):
        return Outcome.OUT_OF_MEMORY
    return Outcome.ERROR


def words_show_allocation_failure(text: str) -> bool:
    """A process's stderr ended with an allocation failure (no exception line: a command's stderr): the error it
    ended with (``ending_error``) shows an allocator's wording, an out-of-memory type as an exception's line names
    it, or NCCL's failed cudaMalloc. Nothing earlier counts: a script that says at start-up that it catches
    ``torch.OutOfMemoryError`` and later exits 1 on a missing folder ran out of nothing (issue 56)."""
    ending = ending_error(text)
    lowered = ending.lower()
    return (
        any(marker in ending for marker in _LAST_WORDS_MARKERS)
        or _TYPE_LINE.search(ending) is not None
        or any(marker in lowered for marker in _NCCL_OOM_MESSAGES)
        or ("ncclunhandledcudaerror" in lowered and "out of memory" in lowered)
    )


#: Lines that are nobody's error of their own: torchrun's log lines (``E1128 12:01:02.123000 4242 file.py:874]
#: ...``), a C++ exception's stack (``Exception raised from ...``, ``frame #3: ...``), faulthandler's dump after
#: an abort (its headline, its threads, the extension modules). A rank's prefix (``[rank1]:``) is taken off first.
_LOG_LINE = re.compile(r"^[EWIFD]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\] ")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:")
_STACK_LINE = re.compile(
    r"^(?:Exception raised from |frame #\d+: |Thread 0x|Current thread 0x|Extension modules: |"
    r"Fatal Python error: Aborted)"
)
#: A line that reports an error (lower case): the ending is the last of them; a step's progress line is none.
_ERROR_WORDS = re.compile(
    r"error|exception|fail|fatal|abort|out of memory|can't allocate|cannot allocate|killed|"
    r"terminate"
)
_TRACEBACK = "Traceback (most recent call last)"
_TERMINATE = "terminate called"
#: How many lines of an exception's message (its type's line and those under it) belong to it at most.
_MESSAGE_LINES = 12


def ending_error(text: str) -> str:
    """The error a process's stderr ended with: the last traceback's exception (its type's line and the message
    under it, never its frames' source lines), the last exception C++ terminated on (``terminate called after
    throwing an instance of 'T'`` and its ``what()``), or else the last line that reports an error, whichever came
    last. torchrun's report and log lines, C++ stacks and faulthandler's dump after an abort are nobody's error
    and are passed over; so are lines that report none (a step's progress, a line printed on the way out)."""
    lines = _own_lines(text)
    ending: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line is not None and line.startswith(_TRACEBACK):
            i += 1
            while i < len(lines) and _frame_line(lines[i]):
                i += 1  # its frames: where it was raised, not what
            ending, i = _block(lines, i)
        elif line is not None and line.startswith(_TERMINATE):
            ending, i = _block(lines, i)
        else:
            if line and not line[:1].isspace() and _ERROR_WORDS.search(line.lower()):
                ending = [line]
            i += 1
    return "\n".join(ending)


def _frame_line(line: str | None) -> bool:
    """A traceback's frame line (indented, blank, or Python's repeat note): where it was raised, not what."""
    return line is not None and (line[:1].isspace() or not line or line.startswith("[Previous line repeated"))


def _own_lines(text: str) -> list[str | None]:
    """The lines of ``text``, a rank's prefix taken off; None for a line that is nobody's error (``_LOG_LINE``,
    ``_STACK_LINE``, torchrun's failure report: a rule, ``<script> FAILED``, its failures, a rule)."""
    raw = [_RANK_PREFIX.sub("", line) for line in text.splitlines()]
    lines: list[str | None] = []
    in_report = False
    for i, line in enumerate(raw):
        rule = line.startswith("=====")
        if rule and not in_report and i + 1 < len(raw) and raw[i + 1].rstrip().endswith("FAILED"):
            in_report = True
        elif rule and in_report:
            in_report = False
            lines.append(None)
            continue
        lines.append(None if in_report or _LOG_LINE.match(line) or _STACK_LINE.match(line) else line)
    return lines


def _block(lines: list[str | None], i: int) -> tuple[list[str], int]:
    """An exception's lines from ``i`` on (its type's line, or terminate's, first): to a blank line, a line of
    nobody's, the next traceback or terminate, or ``_MESSAGE_LINES``."""
    block: list[str] = []
    while i < len(lines) and len(block) < _MESSAGE_LINES:
        line = lines[i]
        if line is None or not line.strip() or line.startswith(_TRACEBACK) or (block and line.startswith(_TERMINATE)):
            break
        block.append(line)
        i += 1
    return block, i


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
    # CUDA libraries create their handles and load their kernels lazily, outside torch's allocator:
    # with the card full, cublasCreate fails as NOT_INITIALIZED (ATen/cuda: "CUDA error:
    # CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"), cuDNN's handle as
    # NOT_INITIALIZED, and cuDNN's frontend, when no engine gets its workspace, says only that it
    # found no engine (pytorch issue 108645). Each also has causes that are not memory.
    "cublas_status_not_initialized",
    "cudnn_status_not_initialized",
    "unable to find an engine to execute this computation",
)

#: Without a budget there is no larger run to try: the evidence is the card at the failure. It was
#: full when less than this was free (cudaMemGetInfo): the larger of 1 GiB and 5 % of the card, more
#: than a library handle, its workspace or a module's kernels take (hundreds of MiB at most).
FULL_CARD_FREE_BYTES = 1024**3
FULL_CARD_FREE_FRACTION = 0.05


def card_was_full(free_bytes: int, total_bytes: int) -> bool:
    """True when a CUDA card had so little free at a failure that a library could not get its memory
    (``free_bytes``: what a library could have had, ``free_at_failure``)."""
    return free_bytes < max(FULL_CARD_FREE_BYTES, FULL_CARD_FREE_FRACTION * total_bytes)


#: A library's handle being created: ``cublasCreate`` (ATen's CublasHandlePool.cpp) and ``cudnnCreate``
#: (cudnn/Handle.cpp) allocate from the driver, outside torch's allocator, with no free-and-retry of its cache
#: (DeviceThreadHandles.h: ``Handle(true)`` creates, nothing catches): its NOT_INITIALIZED comes with the cache held.
_HANDLE_CREATION_MARKERS = (
    "cublascreate",
    "cudnncreate",
    "cublas_status_not_initialized",
    "cudnn_status_not_initialized",
)


def free_at_failure(free_bytes: int, reserved_bytes: int, allocated_bytes: int, message: str = "") -> int:
    """What a library could have had at a failure (``message``: its error): the card's free memory, plus the
    allocator's cache (reserved, not allocated) where the library asks the allocator. cuBLAS's workspace and cuDNN's
    come from torch's allocator, which frees its cache and retries before it fails: read without the cache, a card
    whose cache filled it (any large batch without a budget) looked full, and a cuDNN "unable to find an engine" or a
    32-bit index limit there read as out of memory. A handle's creation never gets the cache back
    (``_HANDLE_CREATION_MARKERS``): counted as free there, a card full of cache turned its failure into an error."""
    if handle_creation(message):
        return free_bytes
    return free_bytes + max(0, reserved_bytes - allocated_bytes)


def handle_creation(message: str) -> bool:
    """A library's handle failed to be created (``_HANDLE_CREATION_MARKERS``)."""
    return any(marker in message.lower() for marker in _HANDLE_CREATION_MARKERS)


def maybe_allocation_failure(message: str) -> bool:
    """True for errors that need evidence (a re-run with more memory) before they count as out of memory."""
    lowered = message.lower()
    return any(marker in lowered for marker in _AMBIGUOUS_MARKERS)
