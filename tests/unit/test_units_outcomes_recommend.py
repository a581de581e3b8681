"""Byte sizes, the out-of-memory classifier and the recommendation arithmetic: plain functions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isoprobe.report.outcomes import Outcome, classify_exception, maybe_allocation_failure
from isoprobe.search.headroom import proven_within, Line, advise, fit_line, headroom_in_bytes
from isoprobe.spec.units import format_bytes, parse_bytes

# --------------------------------------------------------------------------- parse_bytes


@pytest.mark.parametrize(
    "written,expected",
    [
        ("8GiB", 8 * 1024**3),
        ("8gib", 8 * 1024**3),
        ("16 GB", 16 * 1000**3),
        ("16GB", 16 * 1000**3),
        ("512MiB", 512 * 1024**2),
        ("512 MB", 512 * 1000**2),
        ("1.5GiB", int(1.5 * 1024**3)),
        ("4 KiB", 4096),
        ("4k", 4000),
        ("2 TiB", 2 * 1024**4),
        ("1T", 1000**4),
        ("100", 100),
        ("100 B", 100),
        ("  3 GiB  ", 3 * 1024**3),
        (1073741824, 1024**3),
        (2048.0, 2048),
    ],
)
def test_parse_bytes(written, expected):
    assert parse_bytes(written) == expected
    assert isinstance(parse_bytes(written), int)


@pytest.mark.parametrize("written", ["lots", "", "GiB", "8 XB", "-1GiB", "0", "0GiB", "0.5", "1e9", "8 Gi B"])
def test_parse_bytes_rejects_unreadable_strings(written):
    with pytest.raises(ValueError):
        parse_bytes(written)


@pytest.mark.parametrize("written", [0, -1, -2.5, True, False])
def test_parse_bytes_rejects_non_positive_numbers_and_booleans(written):
    with pytest.raises(ValueError):
        parse_bytes(written)


def test_parse_bytes_message_shows_how_to_write_a_size():
    with pytest.raises(ValueError, match="8GiB"):
        parse_bytes("lots")


@settings(max_examples=200, deadline=None)
@given(
    number=st.integers(1, 10**6),
    unit=st.sampled_from(["", "B", "k", "KB", "KiB", "M", "MB", "MiB", "G", "GB", "GiB", "TB", "TiB"]),
    space=st.sampled_from(["", " "]),
)
def test_parse_bytes_scales_whole_numbers_exactly(number, unit, space):
    scale = {
        "": 1, "B": 1, "k": 1000, "KB": 1000, "KiB": 1024, "M": 1000**2, "MB": 1000**2, "MiB": 1024**2,
        "G": 1000**3, "GB": 1000**3, "GiB": 1024**3, "TB": 1000**4, "TiB": 1024**4,
    }[unit]
    assert parse_bytes(f"{number}{space}{unit}") == number * scale


# --------------------------------------------------------------------------- format_bytes


@pytest.mark.parametrize(
    "count,text",
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (5 * 1024**2, "5.00 MiB"),
        (1024**3, "1.00 GiB"),
        (int(2.25 * 1024**3), "2.25 GiB"),
        (1024**4, "1024.00 GiB"),  # GiB is the largest unit
        (-2048, "-2.00 KiB"),
    ],
)
def test_format_bytes(count, text):
    assert format_bytes(count) == text


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1000), st.sampled_from(["KiB", "MiB", "GiB"]))
def test_format_bytes_round_trips_whole_binary_units(number, unit):
    text = format_bytes(parse_bytes(f"{number}{unit}"))
    if number < 1024 or unit == "GiB":
        assert text == f"{number:.2f} {unit}"
    assert parse_bytes(text.replace(" ", "")) == parse_bytes(f"{number}{unit}")


# --------------------------------------------------------------------------- classify_exception

OOM = Outcome.OUT_OF_MEMORY
ERROR = Outcome.ERROR
TORCH_OOM_MRO = ["OutOfMemoryError", "RuntimeError", "Exception", "BaseException", "object"]
RUNTIME_MRO = ["RuntimeError", "Exception", "BaseException", "object"]
ACCELERATOR_MRO = ["AcceleratorError", "RuntimeError", "Exception", "BaseException", "object"]  # torch 2.8+
VALUE_MRO = ["ValueError", "Exception", "BaseException", "object"]
OS_MRO = ["OSError", "Exception", "BaseException", "object"]

#: Each allocator's own wording as the installed torch 2.14 and its bundled libraries hold it (strings on
#: torch/lib/*.so and nvidia/*/lib/*.so, torch/include/ATen/cuda/Exceptions.h), with the prefix torch adds.
ALLOCATOR_MESSAGES = [
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 15.77 GiB "
    "of which 4.12 MiB is free.",
    "CUDA out of memory. Allocation was preemptively rejected because it would exceed per_process_memory_fraction "
    "limit. Requested size: 2.00 GiB",
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 3221225472 bytes. Error code 12 (Cannot allocate memory)",  # measured here under RLIMIT_DATA
    "C10 Out of Memory. Trying to allocate 1073741824 bytes",
    "$ Torch: unable to mmap memory: you tried to mmap 4GB.",
    "unable to mmap 1073741824 bytes from file </torch_1_2>: Cannot allocate memory (12)",
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "CUDA error: CUSPARSE_STATUS_ALLOC_FAILED when calling `cusparseCreate(handle)`",
    "cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`. ",
    "cuFFT error: CUFFT_ALLOC_FAILED",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    "CUDA ran out of memory outside PyTorch's allocator. If this workload uses many dynamic shapes, ...",
    "CUDA driver error: cudaErrorMemoryAllocation",
]


@pytest.mark.parametrize("message", ALLOCATOR_MESSAGES)
@pytest.mark.parametrize("names", [RUNTIME_MRO, ACCELERATOR_MRO, TORCH_OOM_MRO])
def test_an_allocators_own_wording_on_a_runtime_error_is_out_of_memory(names, message):
    assert classify_exception(names, message) is OOM


@pytest.mark.parametrize("message", ALLOCATOR_MESSAGES + ["out of memory", "ran out of memory"])
@pytest.mark.parametrize(
    "names",
    [VALUE_MRO, ["KeyError", "LookupError", "Exception", "BaseException", "object"],
     ["AssertionError", "Exception", "BaseException", "object"], ["Exception", "BaseException", "object"]],
)
def test_the_same_words_on_any_other_type_are_an_error(names, message):
    # A bug whose message mentions memory is still a bug: the words count only on the type the allocators raise.
    assert classify_exception(names, message) is ERROR


def test_a_value_error_that_says_out_of_memory_is_an_error():
    # The hostile model of tests/support/hostile.py: found as out_of_memory (exit 0, a false edge) before the fix.
    message = "the loader ran out of memory-mapped records (a bug, not an allocation)"
    assert classify_exception(VALUE_MRO, message) is ERROR
    assert classify_exception(RUNTIME_MRO, message) is ERROR  # not an allocator's wording either


@pytest.mark.parametrize(
    "names,message",
    [
        (TORCH_OOM_MRO, ""),  # the type alone is enough, whatever the message says
        (TORCH_OOM_MRO, "anything at all"),
        (["MemoryError", "Exception", "BaseException", "object"], ""),
        (["_ArrayMemoryError", "MemoryError", "Exception", "BaseException", "object"], "Unable to allocate"),
        (OS_MRO, "[Errno 12] Cannot allocate memory"),  # measured: mmap above RLIMIT_DATA
        (["BlockingIOError", "OSError", "Exception", "BaseException", "object"], "[Errno 12] Cannot allocate memory"),
    ],
)
def test_allocation_failures_by_type(names, message):
    assert classify_exception(names, message) is OOM


@pytest.mark.parametrize(
    "names,message",
    [
        (RUNTIME_MRO, "mat1 and mat2 shapes cannot be multiplied (64x512 and 256x10)"),
        (RUNTIME_MRO, "CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously "
                      "reported at some other API call, so the stacktrace below might be incorrect."),
        (RUNTIME_MRO, "CUDA error: an illegal memory access was encountered\nCompile with `TORCH_USE_CUDA_DSA` "
                      "to enable device-side assertions."),
        (RUNTIME_MRO, "out of memory"),  # not an allocator's wording: loose text decides nothing
        (RUNTIME_MRO, "MPS backend out of memory (MPS allocated: 1.00 GB)"),  # not a backend isoprobe runs
        (OS_MRO, "[Errno 2] No such file or directory: 'out of memory'"),
        (OS_MRO, "Cannot allocate memory"),  # an OSError made up by hand, without the kernel's errno
        (VALUE_MRO, "Expected more than 1 value per channel"),
        (["KeyError", "LookupError", "Exception", "BaseException", "object"], "'memory'"),
        (["ZeroDivisionError", "ArithmeticError", "Exception", "BaseException", "object"], "division by zero"),
    ],
)
def test_everything_else_is_an_error(names, message):
    assert classify_exception(names, message) is ERROR


def test_classify_exception_is_case_insensitive_on_the_allocators_wording():
    assert classify_exception(RUNTIME_MRO, "CUDA OUT OF MEMORY") is OOM
    assert classify_exception(RUNTIME_MRO, "defaultcpuallocator: Can't Allocate Memory") is OOM


def test_classify_exception_needs_an_exact_type_name():
    # A class merely *named* like memory is not an allocation failure.
    assert classify_exception(["MemoryErrorHandlerFailed", "Exception"], "boom") is ERROR


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_classify_exception_only_ever_answers_oom_or_error(message):
    assert classify_exception(RUNTIME_MRO, message) in (OOM, ERROR)
    assert classify_exception(TORCH_OOM_MRO, message) is OOM
    assert classify_exception(VALUE_MRO, message) is ERROR  # no text makes a ValueError an allocation failure


@pytest.mark.parametrize(
    "message",
    [
        "could not create a primitive",
        "RuntimeError: could not create a primitive descriptor for a convolution forward propagation primitive",
        "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
        "std::bad_alloc",  # measured: MobileNetV3, fp16 autocast, batch 27 under a 1.5 GiB cap
        "RuntimeError: could not execute a primitive",  # measured: DeepLabV3, bf16, batch 3 under 3 GiB
    ],
)
def test_ambiguous_library_errors_are_flagged_but_not_called_oom(message):
    # They *may* be a failed allocation; the message alone must not make them out_of_memory.
    assert maybe_allocation_failure(message)
    assert classify_exception(RUNTIME_MRO, message) is ERROR


@pytest.mark.parametrize(
    "message",
    ["mat1 and mat2 shapes cannot be multiplied", "CUDA error: an illegal memory access was encountered", ""],
)
def test_plain_errors_are_not_ambiguous(message):
    assert not maybe_allocation_failure(message)


# --------------------------------------------------------------------------- fit_line


def test_fit_line_is_exact_on_points_on_a_line():
    line = fit_line([(2, 1200), (4, 1400), (6, 1600)])
    assert line == Line(intercept=1000.0, slope=100.0, points=3)
    assert line.at(10) == 2000.0


def test_fit_line_is_exact_on_doubling_batches():
    points = [(b, 5_000_000 + 250_000 * b) for b in (2, 4, 8, 16, 32, 64)]
    line = fit_line(points)
    assert line.slope == pytest.approx(250_000, rel=1e-12)
    assert line.intercept == pytest.approx(5_000_000, rel=1e-12)
    assert line.points == 6


def test_fit_line_least_squares_on_noisy_points():
    # y = 10 + 2x with residuals +1, -1, -1, +1: least squares recovers the line exactly.
    line = fit_line([(0, 11), (1, 11), (2, 13), (3, 17)])
    assert line.slope == pytest.approx(2.0)
    assert line.intercept == pytest.approx(10.0)


@pytest.mark.parametrize("points", [[], [(4, 100)], [(4, 100), (4, 120)]])
def test_fit_line_needs_two_distinct_batches(points):
    assert fit_line(points) is None


# --------------------------------------------------------------------------- advise

# peak = 1000 + 100 * batch, exactly.
FITTING = [(2, 1200), (4, 1400), (6, 1600)]


def test_headroom_in_bytes_fraction_versus_bytes():
    assert headroom_in_bytes(0.1, 10_000) == 1000
    assert headroom_in_bytes(0.0, 10_000) == 0
    assert headroom_in_bytes(2000, 10_000) == 2000
    assert headroom_in_bytes(1, 10_000) == 1  # an int is bytes, never "100 %"


def test_advise_fraction_headroom():
    advice = advise(200, FITTING, capacity=10_000, headroom=0.1, multiple_of=1)
    assert advice.headroom_bytes == 1000
    assert advice.target_peak_bytes == 9000
    assert advice.batch_size == 80  # (9000 - 1000) / 100
    assert advice.predicted_peak_bytes == 9000
    assert advice.line == Line(1000.0, 100.0, 2)  # none from half of 200 up: the two largest batches, 4 and 6


def test_advise_bytes_headroom():
    advice = advise(200, FITTING, capacity=10_000, headroom=2000, multiple_of=1)
    assert advice.headroom_bytes == 2000
    assert advice.target_peak_bytes == 8000
    assert advice.batch_size == 70
    assert advice.predicted_peak_bytes == 8000


def test_advise_never_above_max():
    advice = advise(50, FITTING, capacity=10_000, headroom=0.1, multiple_of=1)
    assert advice.batch_size == 50


def test_advise_ignores_fits_above_max_for_the_line():
    # A point above max_batch is not part of the fit.
    advice = advise(6, FITTING + [(100, 999_999)], capacity=10_000, headroom=0.1, multiple_of=1)
    assert advice.line == Line(1000.0, 100.0, 2)  # 4 and 6: from half of 6 up


def test_advise_rounds_down_to_multiple_of():
    advice = advise(200, FITTING, capacity=10_000, headroom=1500, multiple_of=8)
    # target 8500 -> 75 -> 72
    assert advice.batch_size == 72
    assert advice.batch_size % 8 == 0
    assert "multiple of 8" in advice.note
    assert advice.predicted_peak_bytes == 1000 + 100 * 72


def test_advise_one_point_falls_back_to_max_without_headroom():
    advice = advise(37, [(37, 5000)], capacity=10_000, headroom=0.5, multiple_of=1)
    assert advice.batch_size == 37
    assert advice.line is None
    assert advice.predicted_peak_bytes is None
    assert "headroom not applied" in advice.note


def test_advise_flat_line_falls_back_to_max():
    advice = advise(8, [(2, 5000), (4, 5000), (8, 5000)], capacity=10_000, headroom=0.1, multiple_of=1)
    assert advice.batch_size == 8
    assert advice.predicted_peak_bytes is None
    assert "headroom not applied" in advice.note


def test_advise_rounding_that_would_give_zero_keeps_the_value():
    advice = advise(3, [(3, 5000)], capacity=10_000, headroom=0.1, multiple_of=8)
    assert advice.batch_size == 3
    assert "kept 3" in advice.note


def test_advise_headroom_unreachable_even_at_one_sample_recommends_one_and_says_so():
    advice = advise(6, FITTING, capacity=1100, headroom=0.1, multiple_of=1)  # target 990, below the 1000 fixed
    assert advice.batch_size == 1
    assert "cannot be met even at 1 sample" in advice.note


def test_advise_headroom_below_every_fitting_batch_is_kept_not_clamped_up():
    """Issue 25: the search started at 0.8 x the estimate's edge (here 40 of an edge at 50), so every batch
    that fit is above a 25 % headroom's line; the recommendation is on the line, below them (it was 40,
    the smallest batch that fit, 1000 bytes above the headroom)."""
    fitting = [(40, 5000), (49, 5900), (50, 6000)]  # peak = 1000 + 100 * batch
    advice = advise(50, fitting, capacity=6000, headroom=0.25, multiple_of=1)
    assert advice.target_peak_bytes == 4500
    assert advice.batch_size == 35 < min(b for b, _ in fitting)
    assert advice.predicted_peak_bytes == 4500 <= advice.target_peak_bytes


def test_advise_measures_the_headroom_from_the_nominal_capacity_not_from_the_line():
    """Issue 34: the capacity was once lowered to the line's peak at the first failing batch, so the target moved
    with the line, and so with the points the search's path happened to measure (12 and 1 recommended by two
    identical probes). Now the capacity is the one given, whatever the line."""
    advice = advise(50, FITTING, capacity=10_000, headroom=0.1, multiple_of=1)
    assert advice.capacity_bytes == 10_000
    assert advice.target_peak_bytes == 9000
    assert advice.batch_size == 50


def test_a_batch_proven_within_the_headroom_is_never_undercut_by_the_line():
    """Issue 34's probe() pair: the same maximum (12), and the recommendation 12 on one path and 1 on the
    other, beside a measured peak well inside the target. The line through whichever points the path
    measured moves; a batch measured within the target does not: the recommendation is never below it."""
    mib = 1 << 20
    capacity, headroom = 1536 * mib, 0.2  # target 1228.8 MiB
    path_a = [(6, 1000 * mib), (10, 1200 * mib), (12, 1220 * mib)]  # the line says 11 (it predicts 12 over)
    path_b = [(6, 1100 * mib), (12, 1220 * mib)]                    # the line says 12
    assert int(fit_line(path_a).at(12)) > capacity * (1 - headroom)
    a, b = advise(12, path_a, capacity, headroom, 1), advise(12, path_b, capacity, headroom, 1)
    assert a.batch_size == b.batch_size == 12
    assert "proven to keep the headroom" in a.note


def test_a_batch_measured_over_the_target_is_never_recommended():
    """The other direction: a line from noisy points may predict a batch within the target that a trial
    measured over it; memory rises with the batch, so that batch and every larger one are over."""
    fitting = [(6, 900), (10, 1000), (12, 1240)]  # the line predicts 12 at 1186, measured 1240
    advice = advise(12, fitting, capacity=1536, headroom=0.2, multiple_of=1)  # target 1229
    assert advice.batch_size == 11 and advice.decided_by == "measured_over"
    assert "measured peak was over the target" in advice.note


def test_the_proven_batch_respects_multiple_of_and_every_run_of_it():
    fitting = [(8, 5000), (12, 5100), (12, 9500), (16, 9400)]  # 12 ran twice, once over the target
    advice = advise(16, fitting, capacity=10_000, headroom=0.1, multiple_of=8)
    assert proven_within(fitting, 9000) == (8, 5000)
    assert advice.batch_size % 8 == 0


@settings(max_examples=300, deadline=None)
@given(
    intercept=st.integers(0, 10**9),
    slope=st.integers(1, 10**7),
    max_batch=st.integers(6, 5000),
    headroom_fraction=st.sampled_from([0.0, 0.05, 0.1, 0.25, 0.5]),
    extra_capacity=st.integers(0, 10**10),
    multiple_of=st.sampled_from([1, 2, 8, 64]),
    first=st.integers(2, 6000),
)
def test_advise_properties(intercept, slope, max_batch, headroom_fraction, extra_capacity, multiple_of, first):
    # The fitting batches start wherever the search started (with an estimate: far up, near the edge).
    fitting = [(b, intercept + slope * b) for b in sorted({min(first, max_batch - 4), max_batch - 2, max_batch})]
    capacity = intercept + extra_capacity + 1
    advice = advise(max_batch, fitting, capacity, headroom_fraction, multiple_of)

    assert 1 <= advice.batch_size <= max_batch
    assert advice.headroom_bytes == int(headroom_fraction * capacity)
    assert advice.target_peak_bytes == capacity - advice.headroom_bytes
    if multiple_of > 1 and advice.batch_size >= multiple_of:
        assert advice.batch_size % multiple_of == 0
    if "cannot be met even at 1 sample" not in advice.note:
        # The recommendation's predicted peak stays within the target, wherever the fitting batches are.
        assert intercept + slope * advice.batch_size <= advice.target_peak_bytes
    if multiple_of == 1 and advice.batch_size < max_batch and "cannot be met" not in advice.note:
        # ... and it is the largest such batch.
        assert intercept + slope * (advice.batch_size + 1) > advice.target_peak_bytes


def test_advise_is_not_thrown_one_short_by_a_slope_an_ulp_above_the_truth():
    """Hypothesis found it: the least-squares slope of (2, 50), (23, 71), (25, 73) is 1.0000000000000002, and
    (50 - 48) // that is 1.0, so batch 1 was recommended although batch 2 peaks at exactly the 50 allowed."""
    advice = advise(25, [(2, 50), (23, 71), (25, 73)], 50, 0.0, 1)
    assert advice.batch_size == 2, advice
