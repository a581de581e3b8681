"""The memory estimate before any trial: one training step of the spec traced without real memory.

Child-side only (the environment check calls it). Under ``FakeTensorMode``
every tensor has a shape, a dtype and a device but no data, so a step at any
batch size costs the same few seconds and no memory. A ``TorchDispatchMode``
of our own (``_Live``) sits above the fake mode and keeps the bytes of every
storage that is alive, the way a caching allocator sees them: a storage counts
from the operation that created it until Python drops its last reference. The
step is the trials' own (``training.Step``: the same precision, output
lifetime, checkpointing, optimizer and user step), run twice, so that the
second step carries the gradients, the optimizer state and the held output of
the first, as the trial's later steps do.

Why two batch sizes, and large ones: the peak of a step is the largest of
several moments (the forward's end, the backward, the optimizer's update, which
for foreach Adam copies every parameter), so at small batches it may sit on a
moment that does not grow with the batch and a line through two small batches
is flat. A fake batch costs nothing per sample, so the line is traced where
activations dominate (``FIRST_BATCHES``), then again around the edge that
line predicts, where the search needs it right.

What the trace cannot see: allocator rounding and caching, fragmentation, the
C library's arenas and the scratch memory of oneDNN/cuDNN kernels. The parent
compares the estimate with the measured line and reports the error; the search
only starts from it and never trusts it for an answer.
"""

from __future__ import annotations

import copy
import math
import signal
import time
from contextlib import contextmanager

from isoprobe.protocol.messages import Estimate
from isoprobe.spec.model import Spec

#: The first pair of traced batches: large enough that activations dominate the peak on most models.
FIRST_BATCHES = (64, 128)
#: The whole estimate (every trace) must end within this many seconds, or it is given up with a note:
#: it runs inside the environment check, which must stay quick (measured: small-cnn ~0.3 s, ResNet50 ~6 s).
TIME_LIMIT_SECONDS = 30.0
#: A trace still running this long after its limit is stuck where the limit's Python exception cannot reach
#: it (a C loop, a blocking call, a handler that swallows it): the process is ended then (``_hard_deadline``).
HARD_GRACE_SECONDS = 5.0
#: Above this many parameters the trace is skipped: the fake step of a large model takes long in Python.
MAX_PARAMETERS = 3_000_000_000
#: The traced batches stay below this: a predicted edge above it is extrapolated from here.
MAX_TRACED_BATCH = 1 << 16


class TraceTimeout(BaseException):
    """The estimate ran past its time limit.

    A BaseException, so that a user's ``except Exception`` around a step that loops
    does not swallow it and keep looping until the check's own timeout.
    """


def skip_reason(spec: Spec, parameter_count: int | None) -> str | None:
    """Why the estimate is not attempted for this spec (None: it is): the reason alone (``Estimate.note``)."""
    if not spec.search.estimate:
        return "search.estimate is false"
    if spec.model.hf_trainer is not None:
        return "model.hf_trainer: the trace follows isoprobe's own step, not your Trainer's loop"
    if spec.model.lightning is not None:
        return "model.lightning: the trace follows isoprobe's own step, not trainer.fit"
    if spec.data is not None:
        return "data: the trace makes synthetic batches, and the worst batch's length falls as it grows"
    if spec.distributed.strategy != "none":
        return f"distributed.strategy {spec.distributed.strategy!r}: the trace follows one process"
    if spec.training.compile:
        return "training.compile: the compiled graph's memory differs from the traced eager step"
    if spec.training.mode == "train" and spec.training.precision == "fp16-mixed":
        return "fp16-mixed: the gradient scaler reads its inf check back (a data-dependent step the trace cannot take)"
    if parameter_count is not None and parameter_count > MAX_PARAMETERS:
        return f"{parameter_count:,} parameters would make the trace slow"
    return None


def estimate(
    torch,
    spec: Spec,
    python_path: list[str],
    device,
    baseline_bytes: int | None,
    time_limit: float = TIME_LIMIT_SECONDS,
) -> Estimate:
    """The estimate for ``spec``'s step on ``device``; a failed trace is an Estimate with its reason, never raised.

    ``baseline_bytes`` (in the budget's units: the CPU backend's import baseline, or what is in use on the card
    before the model exists) is added to the fixed part.
    """
    started = time.perf_counter()
    try:
        with _hard_deadline(time_limit + HARD_GRACE_SECONDS), _deadline(time_limit):
            return _estimate(torch, spec, python_path, device, baseline_bytes, started)
    except TraceTimeout:
        return Estimate(
            note=f"the trace took more than {time_limit:g} s", seconds=round(time.perf_counter() - started, 3)
        )
    except Exception as exc:  # data-dependent ops, custom code, an op without a fake kernel: say so, fall back
        message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return Estimate(
            note=f"the step could not be traced ({message[:300]})", seconds=round(time.perf_counter() - started, 3)
        )


def _estimate(torch, spec, python_path, device, baseline_bytes, started) -> Estimate:
    first = [_trace(torch, spec, python_path, device, batch) for batch in FIRST_BATCHES]
    traces = first
    line = _line(first)
    if line is not None and line[1] > 0:
        # Around the edge this line predicts for a budget like the trials': the batches the search will meet.
        # Without a capacity here (it is resolved in the parent), trace where the activations are ~4x the fixed part.
        fixed, slope = line
        around = int(min(MAX_TRACED_BATCH, max(FIRST_BATCHES[1], 4 * fixed / slope)))
        if around > 2 * FIRST_BATCHES[1]:
            traces = [_trace(torch, spec, python_path, device, batch) for batch in (around // 2, around)]
            line = _line(traces) or line
    if line is None:
        return Estimate(
            note="the traced peak did not grow with the batch: no per-sample cost to predict with",
            seconds=round(time.perf_counter() - started, 3),
        )
    fixed, slope = line
    last = traces[-1]
    baseline = baseline_bytes or 0
    runtime = runtime_bytes(torch, spec) if baseline_bytes is not None and device.type == "cpu" else None
    return Estimate(
        fixed_bytes=round(fixed) + baseline + (runtime or 0),
        per_sample_bytes=slope,
        traced_batch_sizes=[t.batch for t in traces],
        traced_peak_bytes=[t.peak for t in traces],
        parameter_bytes=last.parameters,
        gradient_bytes=last.gradients,
        optimizer_state_bytes=last.optimizer_state,
        buffer_bytes=last.buffers,
        baseline_bytes=baseline_bytes,
        runtime_bytes=runtime,
        seconds=round(time.perf_counter() - started, 3),
    )


def runtime_bytes(torch, spec: Spec) -> int | None:
    """CPU: what the first real training steps add to the data segment beyond their tensors, measured.

    A trace sees tensors only. A real CPU process that starts training also grows
    its data segment by what no tensor holds: the intra-op thread pool's stacks,
    a malloc arena per thread that allocates, oneDNN's state. Measured on a
    stand-in of a few hundred parameters with the spec's optimizer: 10.6 MiB here
    (one OpenMP worker's 8 MiB stack and its arena's first pages); the trials of
    small-cnn and ResNet50 show 100-140 MB between their line's intercept and the
    baseline plus their tensors, so most of the runtime's cost stays outside the
    estimate (its error is reported).

    Read as VmData (what RLIMIT_DATA holds trials to) after each step, never from
    VmPeak: the process's high-water mark, which kept the trace's peaks and a new
    arena's momentary 128 MiB PROT_NONE reservation the cap never counts. With
    VmPeak one spec read 11, 76 or 133 MB (small-cnn predicted 155, 132 or 111).
    """
    from isoprobe.child.core.memory import cpu_memory
    from isoprobe.child.core.training import build_optimizer

    before = cpu_memory().data
    if before is None:
        return None
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 2)
    )
    inputs, targets = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    optimizer = build_optimizer(spec, list(model.parameters()))
    highest = before
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        now = cpu_memory().data
        if now is None:
            return None
        highest = max(highest, now)
    return highest - before


def _line(traces) -> tuple[float, float] | None:
    """(intercept, slope) through two traces; None when the peak does not grow with the batch."""
    low, high = traces
    slope = (high.peak - low.peak) / (high.batch - low.batch)
    if slope <= 0:
        return None
    return low.peak - slope * low.batch, slope


class _Trace:
    """What one traced run showed: its batch, its peak of live bytes, and the fixed categories after it."""

    def __init__(self, batch, peak, parameters, gradients, optimizer_state, buffers):
        self.batch, self.peak = batch, peak
        self.parameters, self.gradients, self.optimizer_state, self.buffers = (
            parameters,
            gradients,
            optimizer_state,
            buffers,
        )


def _trace(torch, spec: Spec, python_path: list[str], device, batch_size: int) -> _Trace:
    """Build the model and run two of the trial's steps at ``batch_size`` on fake tensors; the peak of live bytes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from isoprobe.child.core.training import Step
    from isoprobe.child.core.workload import build_model

    live = _live_mode(torch)
    made = _real_batches(torch, spec, python_path)  # outside the fake mode: the maker's data is real
    with FakeTensorMode(allow_non_fake_inputs=False), _plain_apply(torch), _copies_in_mode(torch), live:
        with torch.device(device), _no_init(torch):
            model = build_model(spec, python_path)
        step = Step(spec, model, device, python_path)
        batch = step.batch(
            batch_size,
            made=_fake_batch(torch, made, batch_size, device, step.float_dtype) if made is not None else None,
        )
        for _ in range(2):
            step.run(batch)
        if spec.training.eval_pass:
            step.evaluate(batch)
        step.release()
        model = step.model
        parameters = _storage_bytes(list(model.parameters()))
        gradients = _storage_bytes([p.grad for p in model.parameters() if p.grad is not None])
        buffers = _storage_bytes(list(model.buffers()))
        state = None
        if step.optimizer is not None:
            state = _storage_bytes(
                [
                    v
                    for s in step.optimizer.state.values()
                    for v in s.values()
                    if isinstance(v, torch.Tensor) and v.dim() > 0
                ]
            )
        peak = live.peak
        del step, model, batch
    return _Trace(batch_size, peak, parameters, gradients, state, buffers)


#: The batch sizes model.batch is run at for real, to tell which of its tensors grow with the batch.
_PROBE_SIZES = (2, 3)


def _real_batches(torch, spec: Spec, python_path: list[str]):
    """model.batch run for real at 2 and 3 samples on the CPU, or None without a batch maker.

    A maker builds its data for real: it reads files, draws from a seeded generator (``int(torch.randint(...,
    generator=g))``) or collates a dataset's samples, none of which can run on fake tensors (a value read back
    is data-dependent: the trace failed on every such maker). So it runs outside the fake mode at two small
    sizes, and the trace gets the same structure at its own batch size (``_fake_batch``)."""
    if spec.model.batch is None or spec.data is not None:
        return None
    from isoprobe.child.core.workload import import_callable

    maker = import_callable(spec.model.batch, python_path)
    return tuple(maker(size, torch.device("cpu")) for size in _PROBE_SIZES)


def _fake_batch(torch, made, batch_size: int, device, float_dtype):
    """The maker's (inputs, targets) at ``batch_size`` on fake tensors: a tensor whose first dimension was 2 and
    3 at the two probe sizes gets ``batch_size`` there, every other tensor keeps its shape; other values stay."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from isoprobe.child.core.workload import Batch, _cast_floats

    small, larger = made
    for pair in made:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"model.batch must return (inputs, targets), got {type(pair).__name__}")
    leaves, structure = tree_flatten(tuple(small))
    others, _ = tree_flatten(tuple(larger))
    if len(others) != len(leaves):
        raise TypeError("model.batch returned differently structured batches at 2 and 3 samples")
    faked = []
    for leaf, other in zip(leaves, others, strict=True):
        if not isinstance(leaf, torch.Tensor):
            faked.append(leaf)
            continue
        grows = (
            leaf.dim() >= 1
            and isinstance(other, torch.Tensor)
            and other.dim() == leaf.dim()
            and leaf.shape[0] == _PROBE_SIZES[0]
            and other.shape[0] == _PROBE_SIZES[1]
            and leaf.shape[1:] == other.shape[1:]
        )
        shape = (batch_size, *leaf.shape[1:]) if grows else tuple(leaf.shape)
        faked.append(torch.empty(shape, dtype=leaf.dtype, device=device))
    inputs, targets = tree_unflatten(faked, structure)
    return Batch(_cast_floats(inputs, float_dtype), targets)


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (tied weights count once)."""
    seen = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[id(storage)] = storage.nbytes()
    return sum(seen.values())


def _live_mode(torch):
    """A dispatch mode that counts the bytes of live storages and keeps their peak."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.storages = WeakIdKeyDictionary()
            self.current = 0
            self.peak = 0
            self._refs = []

        def _forget(self, size, _ref):
            self.current -= size

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for value in tree_flatten(out)[0]:
                if isinstance(value, torch.Tensor):
                    storage = value.untyped_storage()
                    if storage not in self.storages:
                        size = storage.nbytes()
                        self.storages[storage] = size
                        self.current += size
                        self._refs.append(weakref.ref(storage, lambda ref, size=size: self._forget(size, ref)))
            self.peak = max(self.peak, self.current)
            return out

    return Live()


@contextmanager
def _no_init(torch):
    """``torch.nn.init``'s in-place initialisers as no-ops while the traced model is built.

    A fake tensor has shapes and no values, and some initialisers read values back
    (``trunc_normal_`` samples by rejection: ``.item()``, ``mask.any()``), which a
    trace cannot do: measured, vit_b_16 could not be traced for this. The values do
    not change what the step allocates; torch itself skips them on the meta device.
    """
    init = torch.nn.init
    names = [
        name for name in dir(init) if name.endswith("_") and not name.startswith("_") and callable(getattr(init, name))
    ]
    originals = {name: getattr(init, name) for name in names}

    def unchanged(tensor, *args, **kwargs):
        return tensor

    for name in names:
        setattr(init, name, unchanged)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(init, name, original)


def _copies_in_mode(torch):
    """``copy.deepcopy`` of a fake tensor as a clone in the trace's own fake mode, grad included.

    torch deep-copies a FakeTensor into a fresh fake mode, and the next operation
    that meets the copy and the original fails ("Mixing fake modes"). Models deep-copy
    their own layers (``nn.TransformerEncoder`` clones its layer per depth) and
    steps deep-copy models (an EMA copy, ``AveragedModel``): measured, two of the
    shipped specs could not be traced for this. A clone in the active mode is also
    what the real copy costs: new storage of the same size, counted by the live mode.
    """
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode

    class CopiesInMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is not torch.Tensor.__deepcopy__ or not isinstance(args[0], FakeTensor):
                return func(*args, **(kwargs or {}))  # anything else, and a real tensor's copy, as torch does it
            tensor, memo = args
            if id(tensor) in memo:
                return memo[id(tensor)]
            with torch.no_grad():
                copied = tensor.clone(memory_format=torch.preserve_format)
            if isinstance(tensor, torch.nn.Parameter):
                copied = torch.nn.Parameter(copied, requires_grad=tensor.requires_grad)
            elif tensor.requires_grad and tensor.is_leaf:
                copied.requires_grad_(True)
            memo[id(tensor)] = copied
            if tensor.grad is not None:
                copied.grad = copy.deepcopy(tensor.grad, memo)
            return copied

    return CopiesInMode()


@contextmanager
def _plain_apply(torch):
    """``Module.to`` (and every ``_apply``) for fake parameters: new Parameter objects instead of a swap.

    torch swaps a FakeTensor parameter in place (``torch.utils.swap_tensors``), which refuses a tensor
    that fake mode holds a weak reference to: ``model.to(device)`` in the trial's own ``Step`` would fail.
    For the trace, conversions replace the parameter (the optimizer is built after them, as in a trial).
    """
    module_class = torch.nn.Module
    original = module_class._apply

    def _apply(self, fn, recurse=True):
        if recurse:
            for child in self.children():
                child._apply(fn)
        with torch.no_grad():
            for key, param in list(self._parameters.items()):
                if param is not None:
                    applied = fn(param)
                    if applied is not param:
                        self._parameters[key] = torch.nn.Parameter(applied, requires_grad=param.requires_grad)
            for key, buffer in list(self._buffers.items()):
                if buffer is not None:
                    self._buffers[key] = fn(buffer)
        return self

    module_class._apply = _apply
    try:
        yield
    finally:
        module_class._apply = original


@contextmanager
def _deadline(seconds: float):
    """Raise ``TraceTimeout`` in the main thread after ``seconds`` (SIGALRM; the child uses no other alarm)."""
    if seconds <= 0 or not math.isfinite(seconds):
        yield
        return

    def expired(_signum, _frame):
        raise TraceTimeout()

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _hard_deadline(seconds: float):
    """End this process after ``seconds`` unless the block is left first, whatever the main thread is doing.

    Why: ``_deadline``'s exception is raised by a Python signal handler, which
    runs only between bytecodes: a trace stuck in C (a loop in an extension, a
    blocking call that retries on EINTR) never gets it, and the check would
    then wait for its whole timeout (search.trial_timeout) for an estimate that
    is only a starting point. faulthandler's watchdog is a native thread that
    needs no GIL: it writes every thread's stack to stderr under the headline
    "Timeout (h:mm:ss)!" and exits with status 1. The check's verdict was sent
    before the trace began, so the parent keeps it and starts the search
    without an estimate (``pipeline.environment.inspect_environment`` names why).
    """
    import faulthandler

    if seconds <= 0 or not math.isfinite(seconds):
        yield
        return
    faulthandler.dump_traceback_later(seconds, exit=True, file=2)  # the fd: sys.stderr may be replaced
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
