"""issue 45, items 2, 3 and 5 (the command half): a command trial's CUDA budget, readings and NCCL's out of memory,
on the fake device of tests/support/fake_cuda.py.

The shim (``isoprobe/child/shim/_isoprobe_shim.py``) is imported as a module of its own, with a fake ``torch`` in
``sys.modules``, as the user's process would have torch; the supervisor (``isoprobe.child.command_trial.supervisor``) runs in a fresh
interpreter where it starts a command, since it kills every process below its own when a trial ends.

``LazyFakeCuda`` (tests/support/lazy_fake_cuda.py) adds CUDA's lazy initialisation to the fake, which the shim
relies on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from fake_cuda import (GiB, MiB, NCCL_OOM_MESSAGE, DistBackendError, FakeCard, FakeCuda,  # noqa: E402
                       OutOfMemoryError, fake_torch)
from lazy_fake_cuda import LazyFakeCuda  # noqa: E402

from isoprobe.child.command_trial import supervisor  # noqa: E402
from isoprobe.child.command_trial import start as command_start  # noqa: E402
from isoprobe.child.command_trial import tree as command_tree
from isoprobe.child.command_trial import verdicts as command_verdicts
from isoprobe.child.core import cuda as child_cuda  # noqa: E402
from isoprobe.protocol.command import SHIM_FOLDER, ShimException, ShimStep, parse_lines  # noqa: E402
from isoprobe.protocol.messages import TrialRequest  # noqa: E402
from isoprobe.report.outcomes import Outcome  # noqa: E402
from isoprobe.spec.model import Spec  # noqa: E402

BUDGET = 8 * GiB
CONTEXT = 500 * MiB


@pytest.fixture
def shim(tmp_path, monkeypatch):
    """A fresh copy of the shim's module, its trial folder ``tmp_path`` (the gate open), the hooks' registrar."""
    spec = importlib.util.spec_from_file_location("_isoprobe_shim_under_test", SHIM_FOLDER / "_isoprobe_shim.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for loaded in ("_isoprobe_child_shim__isoprobe_cuda", "_isoprobe_child_cuda_readings"):  # one process's state
        monkeypatch.delitem(sys.modules, loaded, raising=False)
    monkeypatch.setenv(module.DIR_ENV, str(tmp_path))
    monkeypatch.setattr(sys, "addaudithook", lambda hook: None)  # not into pytest's own process for good
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    module._state["dir"] = str(tmp_path)
    (tmp_path / "gate").write_text("1000")
    return module


def _torch(monkeypatch, cuda: LazyFakeCuda):
    torch = fake_torch(cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", cuda)
    return torch


def _register(shim, monkeypatch, budget: int | None = BUDGET, outside: int | None = None) -> types.SimpleNamespace:
    """What happens when torch imports its optimizers in a trial's process (torch.cuda is imported before them)."""
    if budget is not None:
        monkeypatch.setenv(shim.CUDA_BUDGET_ENV, str(budget))
    if outside is not None:
        monkeypatch.setenv(getattr(shim, "CUDA_OUTSIDE_ENV", "ISOPROBE_SHIM_CUDA_OUTSIDE"), str(outside))
    hooks = types.SimpleNamespace(pre=[], post=[])
    optimizer = types.SimpleNamespace(register_optimizer_step_pre_hook=hooks.pre.append,
                                      register_optimizer_step_post_hook=hooks.post.append)
    shim._register(optimizer)
    return hooks


def _step(hooks) -> None:
    for hook in hooks.pre:
        hook(None, (), {})
    for hook in hooks.post:
        hook(None, (), {})


def _steps_written(folder: Path) -> list[ShimStep]:
    [file] = folder.glob("p*.jsonl")
    return [line for line in parse_lines(file.read_bytes()) if isinstance(line, ShimStep)]


# ----------------------------------------------------------------------------------------------- item 2


def test_the_budget_caps_the_first_forward_with_the_outside_memory_taken_off(shim, monkeypatch):
    """Item 2: the fraction was budget / total, set at the first optimizer step, after an uncapped first forward and
    backward: a first forward of 7.6 GiB under an 8 GiB budget (500 MiB of context besides) ran. Now the cap is in
    place at CUDA's initialisation, before the first allocation, with the outside memory's estimate taken off."""
    cuda = LazyFakeCuda(FakeCard(total=80 * GiB), context_bytes=CONTEXT)
    _torch(monkeypatch, cuda)
    _register(shim, monkeypatch, outside=600 * MiB)
    cuda.allocate(100 * MiB, "cuda:0")  # the model's weights: CUDA initialises here
    assert cuda.devices[0].fraction == pytest.approx((BUDGET - 600 * MiB) / (80 * GiB))
    assert cuda.calls.index(("lazy_init",)) < cuda.calls.index(("fraction", cuda.devices[0].fraction, 0))
    with pytest.raises(OutOfMemoryError):
        cuda.allocate(7600 * MiB, "cuda:0")  # the activations of a batch the smaller card could not hold


def test_without_an_estimate_the_first_steps_reading_of_the_outside_memory_tightens_the_cap(shim, monkeypatch):
    cuda = LazyFakeCuda(FakeCard(total=80 * GiB), context_bytes=CONTEXT)
    _torch(monkeypatch, cuda)
    hooks = _register(shim, monkeypatch)
    block = cuda.allocate(1 * GiB, "cuda:0")
    assert cuda.devices[0].fraction == pytest.approx(BUDGET / (80 * GiB))  # nothing known to take off yet
    cuda.load(300 * MiB, "NCCL")
    _step(hooks)
    cuda.free(block, "cuda:0")
    assert cuda.devices[0].fraction == pytest.approx((BUDGET - CONTEXT - 300 * MiB) / (80 * GiB))
    [line] = _steps_written(Path(os.environ[shim.DIR_ENV]))
    assert line.outside_bytes == CONTEXT + 300 * MiB and line.device == "cuda:0"


def test_a_steps_reading_is_in_the_budgets_units_and_never_drops(shim, monkeypatch):
    """Item 2: the step's reading was the reserved peak, which leaves the context out and which the supervisor never
    compared with the budget. Now it is the allocator's need plus the memory outside it, a running peak."""
    cuda = LazyFakeCuda(FakeCard(total=80 * GiB), context_bytes=CONTEXT)
    _torch(monkeypatch, cuda)
    hooks = _register(shim, monkeypatch)
    blocks = [cuda.allocate(300 * MiB, "cuda:0") for _ in range(20)]
    _step(hooks)
    for block in blocks:
        cuda.free(block, "cuda:0")
    cuda.empty_cache()
    _step(hooks)
    first, second = _steps_written(Path(os.environ[shim.DIR_ENV]))
    assert first.budget_peak_bytes == 20 * 300 * MiB + CONTEXT
    assert second.budget_peak_bytes == first.budget_peak_bytes  # the outside read lower can never lower the peak
    # Issue 49: what the process held right after each step, in the same units (allocated now plus the memory outside
    # the allocator): the trial's base reading, which gives one batch its own slope. It does drop.
    assert first.held_budget_bytes == 20 * 300 * MiB + CONTEXT and second.held_budget_bytes == CONTEXT


@pytest.mark.parametrize("backend", ["native", "cudaMallocAsync"])
def test_the_shims_arithmetic_is_isoprobes_own_on_the_same_readings(shim, monkeypatch, backend):
    """The shim loads ``child/cuda_readings.py`` by path (it imports nothing of isoprobe by name): the same fake
    readings (a cap reached with the allocator's free-and-retry, split segments, memory outside the allocator) give
    the same budget reading, the allocator's need and the outside memory."""
    cuda = LazyFakeCuda(FakeCard(total=16 * GiB), context_bytes=CONTEXT, backend=backend)
    torch = _torch(monkeypatch, cuda)
    cuda.init()
    cuda.set_per_process_memory_fraction(0.25, "cuda:0")
    blocks = []
    for size in [3 * MiB, 100 * MiB, 700 * 1024, 15 * MiB] * 60:
        try:
            blocks.append(cuda.allocate(size, "cuda:0"))
        except OutOfMemoryError:
            cuda.free(blocks.pop(0), "cuda:0")
    for block in blocks[::3]:
        cuda.free(block, "cuda:0")
    cuda.load(200 * MiB, "cuBLAS")
    theirs = child_cuda.card_reading(torch.cuda, 0)
    readings = shim._readings()
    assert Path(readings.__file__).resolve() == Path(child_cuda.card_reading.__code__.co_filename).resolve()
    ours = readings.card_reading(cuda, 0)
    assert {k: ours[k] for k in theirs} == theirs
    assert ours["retries"] > 0 if backend == "native" else True
    assert readings.allocator_need(10, 4, 3, False) == child_cuda.allocator_need(10, 4, 3, False) == 7
    assert readings.budget_fraction(BUDGET, 80 * GiB, 700 * MiB) == child_cuda.budget_fraction(BUDGET, 80 * GiB,
                                                                                               700 * MiB)


def test_a_scripts_own_fraction_is_honoured_as_a_fraction_of_the_budget(shim, monkeypatch):
    """Item 2: the shim replaced a script's own ``set_per_process_memory_fraction`` at its first step with the
    budget's. On the emulated card (the budget) the script's 0.5 is half the budget, and asking gives its 0.5."""
    cuda = LazyFakeCuda(FakeCard(total=80 * GiB), context_bytes=CONTEXT)
    torch = _torch(monkeypatch, cuda)
    hooks = _register(shim, monkeypatch, outside=CONTEXT)
    torch.cuda.set_per_process_memory_fraction(0.5, 0)
    cuda.allocate(100 * MiB, "cuda:0")
    _step(hooks)
    assert cuda.devices[0].fraction == pytest.approx(0.5 * BUDGET / (80 * GiB))
    assert torch.cuda.get_per_process_memory_fraction(0) == 0.5
    [line] = _steps_written(Path(os.environ[shim.DIR_ENV]))
    assert line.script_memory_fraction == 0.5
    torch.cuda.set_per_process_memory_fraction(1.0, 0)  # all of the emulated card: the budget less the outside
    assert cuda.devices[0].fraction == pytest.approx((BUDGET - CONTEXT) / (80 * GiB))
    with pytest.raises(ValueError):
        torch.cuda.set_per_process_memory_fraction(1.5, 0)  # torch's own refusal stands


def _run_trial(tmp_path: Path, lines: list[dict], budget: int = BUDGET, steps: int = 3) -> dict:
    """The supervisor (in a fresh interpreter: it kills every process below its own at the end) on a command that
    writes the shim's lines itself, as a rank on a GPU would, and then waits to be ended."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import json, os, time\n"
        f"lines = json.loads({json.dumps(lines)!r})\n"
        "path = os.path.join(os.environ['ISOPROBE_SHIM_DIR'], f'p{os.getpid()}.jsonl')\n"
        "with open(path, 'a') as f:\n"
        "    for line in lines:\n"
        "        f.write(json.dumps({'pid': os.getpid(), **line}) + '\\n')\n"
        "time.sleep(60)\n")
    spec = Spec.model_validate({"command": [sys.executable, str(script), "{batch_size}"], "command_dir": str(tmp_path)})
    request = TrialRequest(spec=spec, batch_size=4, device="cuda:0", memory_budget_bytes=budget, steps=steps)
    runner = ("import json, sys\n"
              "from isoprobe.child.command_trial.supervisor import run_command_trial\n"
              "from isoprobe.protocol.messages import TrialRequest\n"
              "class Events:\n"
              "    def emit(self, event):\n"
              "        if event.event == 'result': print(event.model_dump_json())\n"
              "run_command_trial(TrialRequest.model_validate_json(sys.stdin.read()), Events())\n")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", runner], input=request.model_dump_json(), capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cuda_step(number: int, budget_peak: int, outside: int | None = CONTEXT) -> dict:
    """A step line as the shim writes it on CUDA (``outside=None``: only the fields every shim wrote)."""
    line = {"kind": "step", "step": number, "seconds": 0.1, "peak_bytes": budget_peak - (outside or CONTEXT),
            "held_bytes": 1 * GiB, "budget_peak_bytes": budget_peak, "device": "cuda:0", "t": 1.0 + number}
    if outside is not None:
        line.update(peak_allocated_bytes=budget_peak - outside, outside_bytes=outside, alloc_retries=0)
    return line


def test_the_supervisor_judges_every_cuda_step_against_the_budget(tmp_path):
    """Item 2: no CUDA reading was judged against the budget (the over-budget check was the CPU's): a rank that held
    8.2 GiB of the card under an 8 GiB budget, its context included, was a fit. Now it is out of memory, named."""
    hello = {"kind": "hello", "ppid": 1, "rank": 0, "local_rank": 0, "world_size": 1, "argv": [], "t": 1.0}
    over = 8 * GiB + 200 * MiB
    result = _run_trial(tmp_path, [hello, _cuda_step(1, 7 * GiB, None), _cuda_step(2, over, None),
                                   _cuda_step(3, over, None)])
    assert result["outcome"] == "out_of_memory", result
    assert result["error"]["type"] == "CommandOverBudget" and "rank 0" in result["error"]["message"]
    assert "optimizer step 2" in result["error"]["message"] and result["phase"] == "step 2"
    assert result["budget_peak_bytes"] == over
    with_parts = _run_trial(tmp_path, [hello, _cuda_step(1, over)])
    assert "+ 500.0 MiB outside it" in with_parts["error"]["message"], with_parts


def test_a_cuda_trial_within_the_budget_fits_with_its_readings(tmp_path):
    hello = {"kind": "hello", "ppid": 1, "rank": None, "local_rank": None, "world_size": None, "argv": [], "t": 1.0}
    result = _run_trial(tmp_path, [hello, *(_cuda_step(n, 7 * GiB) for n in (1, 2, 3))])
    assert result["outcome"] == "fits", result
    assert result["budget_peak_bytes"] == 7 * GiB and result["peak_allocated_bytes"] == 7 * GiB - CONTEXT


def test_the_outside_estimate_reaches_the_shim_through_the_environment(tmp_path):
    spec = Spec.model_validate({"command": "python t.py {batch_size}", "command_dir": "/tmp"})
    request = TrialRequest(spec=spec, batch_size=4, device="cuda:0", memory_budget_bytes=BUDGET)
    env = command_start.request_environment(request, tmp_path)
    assert env["ISOPROBE_SHIM_CUDA_BUDGET"] == str(BUDGET)
    assert "ISOPROBE_SHIM_CUDA_OUTSIDE" not in env  # no figure in the request: the first step's reading decides
    with_figure = types.SimpleNamespace(**{**dict(request), "cuda_outside_bytes": 600 * MiB})
    assert command_start.request_environment(with_figure, tmp_path)["ISOPROBE_SHIM_CUDA_OUTSIDE"] == str(600 * MiB)


# ----------------------------------------------------------------------------------------------- item 3


@pytest.mark.parametrize("backend", ["native", "cudaMallocAsync"])
def test_a_rank_that_placed_its_model_on_its_own_gpu_is_read_there_and_gpu_0_is_never_touched(shim, monkeypatch,
                                                                                              backend):
    """Item 3: a DDP rank that placed its model with ``.to(f"cuda:{rank}")`` without set_device was read and capped on
    ``current_device()`` (0), and ``synchronize(0)`` put a context on GPU 0 in every rank. Now the devices it uses
    (their allocator reserved memory) are read and capped, and no other device is asked anything that needs one."""
    cuda = LazyFakeCuda(FakeCard(total=80 * GiB), FakeCard(total=80 * GiB), context_bytes=CONTEXT, backend=backend)
    _torch(monkeypatch, cuda)
    hooks = _register(shim, monkeypatch, outside=CONTEXT)
    cuda.allocate(2 * GiB, "cuda:1")  # rank 1's model
    _step(hooks)
    assert cuda.contexts() == [1]
    [line] = _steps_written(Path(os.environ[shim.DIR_ENV]))
    assert line.device == "cuda:1" and line.budget_peak_bytes == 2 * GiB + CONTEXT
    assert cuda.devices[1].fraction == pytest.approx((BUDGET - CONTEXT) / (80 * GiB))


def test_a_process_that_steps_on_the_cpu_reads_the_cpu_even_with_cuda_initialised(shim, monkeypatch):
    cuda = LazyFakeCuda(FakeCard(), context_bytes=CONTEXT)
    _torch(monkeypatch, cuda)
    hooks = _register(shim, monkeypatch)
    cuda.device_count() and cuda._lazy_init()  # CUDA initialised (a library asked), no tensor on a card
    _step(hooks)
    [line] = _steps_written(Path(os.environ[shim.DIR_ENV]))
    assert line.device == "cpu" and cuda.contexts() == []


# ----------------------------------------------------------------------------------------------- item 5


def test_nccls_out_of_memory_is_out_of_memory_from_the_exception_line():
    names = [cls.__name__ for cls in DistBackendError.__mro__]
    failed = command_tree.Process(pid=1, exception=ShimException(
        kind="exception", pid=1, types=names, type="torch.distributed.DistBackendError", message=NCCL_OOM_MESSAGE,
        traceback="Traceback...\n", thread=None, steps=2, t=1.0))
    outcome, error, phase = command_verdicts.exception_verdict(failed, judged=2)
    assert outcome is Outcome.OUT_OF_MEMORY and phase == "step 3"


@pytest.mark.parametrize("status, stderr", [
    (1, "torch.distributed.DistBackendError: " + NCCL_OOM_MESSAGE),
    # The watchdog's abort: no exception reaches the top, the rank dies of SIGABRT with NCCL's words in stderr.
    (-6, "[rank1]:[E] ProcessGroupNCCL.cpp:1899] [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog "
         "thread terminated with exception: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
         "\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'"),
])
def test_nccls_out_of_memory_is_out_of_memory_from_stderr(tmp_path, status, stderr):
    """Item 5: NCCL's failed cudaMalloc matched none of the stderr markers: a gang at the edge of a real card ended in
    an error (exit 4) instead of an out-of-memory verdict."""
    (tmp_path / "stderr").write_text(stderr)
    spec = Spec.model_validate({"command": "python t.py {batch_size}", "command_dir": "/tmp"})
    request = TrialRequest(spec=spec, batch_size=4, device="cuda:0", steps=3)
    outcome, error, _ = command_verdicts.exit_verdict(status, 1, request, tmp_path / "stderr")
    assert outcome is Outcome.OUT_OF_MEMORY and error.type == "CommandOutOfMemory"


def test_nccls_other_failures_stay_errors(tmp_path):
    other = NCCL_OOM_MESSAGE.replace("Cuda failure 2 'out of memory'", "Cuda failure 700 'an illegal memory access'")
    (tmp_path / "stderr").write_text(other)
    spec = Spec.model_validate({"command": "python t.py {batch_size}", "command_dir": "/tmp"})
    request = TrialRequest(spec=spec, batch_size=4, device="cuda:0", steps=3)
    outcome, _, _ = command_verdicts.exit_verdict(1, 1, request, tmp_path / "stderr")
    assert outcome is Outcome.ERROR


def test_a_cap_loosened_by_kernels_loaded_later_is_lowered_and_that_steps_reading_is_no_verdict(shim, monkeypatch):
    """The H200's command trial (docs/gpu.md, part b): the model's kernels loaded 2 MiB after the cap, the allocator
    reached the loose cap, and the supervisor called the batch over the budget (75; a card with only the budget free
    trained 75 and 76). Now that step says ``cap_lowered``, is not judged, and the next step's reading is."""
    cuda = LazyFakeCuda(FakeCard(total=80 * GiB), context_bytes=CONTEXT, lazy_kernel_bytes=0)
    _torch(monkeypatch, cuda)
    hooks = _register(shim, monkeypatch, outside=CONTEXT)
    weights = [cuda.allocate(100 * MiB, "cuda:0") for _ in range(10)]  # CUDA initialises: capped, 500 MiB left out

    def train_step(first=False):
        if first:
            cuda.load(2 * MiB, "the model's kernels, loaded at their first use", "cuda:0")
        small = [cuda.allocate(6 * MiB, "cuda:0") for _ in range(300)]  # 20 MiB segments, cached after
        for block in small:
            cuda.free(block, "cuda:0")
        large = [cuda.allocate(204 * MiB, "cuda:0") for _ in range(32)]  # lands on the loose cap, then retries
        for block in large:
            cuda.free(block, "cuda:0")
        _step(hooks)

    train_step(first=True)
    train_step()
    first, second = _steps_written(Path(os.environ[shim.DIR_ENV]))
    assert first.cap_lowered and first.budget_peak_bytes == BUDGET + 2 * MiB  # what the H200 read
    assert not second.cap_lowered and second.budget_peak_bytes <= BUDGET
    assert cuda.devices[0].fraction == pytest.approx((BUDGET - CONTEXT - 2 * MiB) / (80 * GiB))
    request = TrialRequest(spec=Spec.model_validate({"command": ["python", "train.py", "{batch_size}"]}), batch_size=75,
                           device="cuda:0", memory_budget_bytes=BUDGET)
    ranks = [types.SimpleNamespace(name="the process", steps=[first, second])]
    assert command_verdicts.over_budget(request, ranks, 1) is None  # read under the loose cap: not judged
    assert command_verdicts.over_budget(request, ranks, 2) is None
    assert len(weights) == 10
