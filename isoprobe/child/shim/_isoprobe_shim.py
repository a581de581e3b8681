"""Inside the user's own processes: count optimizer steps, read memory after each, and report them.

Loaded by this folder's ``sitecustomize`` in a Python process of a command trial (the script, torchrun's ranks,
a launcher's children) only when torch imports its optimizer module, or when an exception reaches the top of
the process: a process that never imports torch loads nothing of it. Then it registers torch's global optimizer
step hooks (``register_optimizer_step_pre_hook`` / ``..._post_hook``), which see every optimizer step of every
``torch.optim.Optimizer`` in the process, whatever loop calls it (the user's, Lightning's, the Trainer's,
Accelerate's).

After each optimizer step it appends one JSON line to its own file in the trial's folder (its step, time and
memory readings, in the units of isoprobe's own trials) and then waits at the *gate* until the trial's
supervisor (``isoprobe.child.command_trial.supervisor``, which judges every process's steps as the parent judges a
trial) allows
the next step. A process is never ended from here (a rank that left in a hook while the others sit in a
collective would block them): the supervisor ends the whole tree once it has seen enough. An exception that
reaches the top of a process is written too, so an out-of-memory is classified from the exception itself.

Standard library only, and small: it lives in the process that is being measured. The line formats are
``isoprobe.protocol.command``'s models (checked there, in the supervisor), written here with ``json`` alone.
"""

import os
import sys

#: typing's flag without importing typing into the user's process (annotations here are strings: never evaluated).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# What the functions below import, they import when they first run: after torch has imported those modules
# anyway, so that the shim adds as little as it can to the heap it measures (see sitecustomize).


def _own(relative):
    """``isoprobe/RELATIVE.py`` (standard library only) through the standalone layer's one loader
    (``system/standalone.py``): the shim imports nothing of isoprobe by name (a package's ``__init__`` may import
    pydantic). The loader itself is the one file loaded here by hand, once; it is ``_isoprobe_standalone`` after."""
    loader = sys.modules.get("_isoprobe_standalone")
    if loader is None:
        import importlib.util

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        spec = importlib.util.spec_from_file_location(
            "_isoprobe_standalone", os.path.join(root, "system", "standalone.py")
        )
        loader = importlib.util.module_from_spec(spec)
        sys.modules["_isoprobe_standalone"] = loader
        spec.loader.exec_module(loader)
    return loader.load(relative)


_wiring = _own("protocol/wiring")
#: The trial's folder: this process's lines go to ``p<pid>.jsonl`` in it, and the supervisor's gate file.
DIR_ENV = _wiring.SHIM_DIR_ENV
#: CUDA: the per-rank budget in bytes: what the process may hold of each card it uses, context and libraries
#: included (what ``cudaMemGetInfo`` shows it holding), as isoprobe's own trials mean it (``child.core.cuda``).
CUDA_BUDGET_ENV = _wiring.SHIM_CUDA_BUDGET_ENV
#: CUDA: the best figure for the memory outside the allocator known before the command runs (bytes), taken off
#: the fraction from CUDA's lazy initialisation on; each step's own reading of it takes over once it is larger.
CUDA_OUTSIDE_ENV = _wiring.SHIM_CUDA_OUTSIDE_ENV
_GATE_POLL_SECONDS = 0.002
_MESSAGE_CHARS = 2000
_TRACEBACK_CHARS = 8000
_SYSTEM_FOLDERS = ("/proc/", "/sys/", "/dev/", "/run/")

_state: "dict[str, Any]" = {
    "dir": None,
    "fd": None,
    "pid": None,
    "steps": 0,
    "last": None,
    "reported": set(),
    "reads": set(),
    "roots": (),
    "modules_done": 0,
    "lock": None,
    # The batch each step trained at: ``_isoprobe_forwards``, once its hooks are in.
    "forwards": None,
    # torch.save calls since the step before (``_watch_saves``: a checkpoint write is a phase of the cycle).
    "saves": [0],
    "saves_watched": False,
}


def hooked_spec(name, path):
    """The spec of torch's optimizer module, whose loading then registers the step hooks (``sitecustomize``'s
    finder calls this when torch imports it), if this process is in a trial."""
    folder = os.environ.get(DIR_ENV)
    finder = next(f for f in sys.meta_path if getattr(f, "__name__", "") == "PathFinder")
    spec = finder.find_spec(name, path)
    if not folder or spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return spec
    _state["dir"] = folder
    run_module = spec.loader.exec_module

    def exec_module(module):
        run_module(module)
        _register(module)

    spec.loader.exec_module = exec_module  # this file's own loader object: nothing else shares it
    return spec


#: The start-up hook's reads and its hand-over list (``sitecustomize``), when it noted the process from its start;
#: the pid whose hooks were registered (a process forked from it, a DataLoader worker, reports its reads at once).
_early = {"reads": None, "handler": None, "pid": None}


def adopt_early_reads(reads, handler):
    """``sitecustomize``'s reads since the interpreter started, and its hook's hand-over list: ``_audit`` takes
    both over once the step hooks are registered (one audit hook a process: hooks cannot be removed)."""
    _early["reads"], _early["handler"] = reads, handler


def _watch_threads_and_reads():
    """Once torch is in: exceptions that end a thread, and the files the process opens (noted from the
    interpreter's start by ``sitecustomize``'s hook, which hands over to ``_audit`` here)."""
    import threading

    _state["lock"] = threading.Lock()
    _state["roots"] = _environment_roots()
    native = _own("child/native_reads")  # the links on a read's way, native readers: loaded before _audit is on
    previous_thread_hook = threading.excepthook

    def thread_hook(args):
        if args.exc_type is not None and not issubclass(args.exc_type, SystemExit):
            report_exception(args.exc_type, args.exc_value, args.exc_traceback, getattr(args.thread, "name", None))
        previous_thread_hook(args)

    threading.excepthook = thread_hook
    _early["pid"] = os.getpid()
    if _early["handler"] is not None:
        _state["reads"].update(_early["reads"] or ())  # what the script read before it imported torch (its config)
        _early["handler"].append(_audit)
    else:
        sys.addaudithook(_audit)
    native.watch(_audit)  # native readers' Python entry points: their calls noted as opens


def _register(module):
    import time

    try:
        module.register_optimizer_step_post_hook(_after_step)
        _watch_threads_and_reads()
    except Exception as exc:  # a torch without global hooks: the trial sees no step and says why
        sys.stderr.write(f"isoprobe shim: cannot hook torch's optimizers ({type(exc).__name__}: {exc})\n")
        return
    try:
        import _isoprobe_forwards  # this folder's: the input shapes of the model's forwards, per step

        if _isoprobe_forwards.watch(sys.modules.get("torch.nn.modules.module")):
            _state["forwards"] = _isoprobe_forwards
            _isoprobe_forwards.marks["notify"] = _forward_mark
    except Exception as exc:  # the steps still count; the trial is then not judged by the batch it trained at
        sys.stderr.write(f"isoprobe shim: cannot watch the model's forwards ({type(exc).__name__}: {exc})\n")
    _state["last"] = time.perf_counter()
    # RANK / WORLD_SIZE as torchrun, accelerate launch and DeepSpeed set them; else a Slurm step's task numbers.
    rank, world = _int_env("RANK"), _int_env("WORLD_SIZE")
    if rank is None and (_int_env("SLURM_STEP_NUM_TASKS") or 1) > 1:
        rank, world = _int_env("SLURM_PROCID"), _int_env("SLURM_STEP_NUM_TASKS")
    _write(
        {
            "kind": "hello",
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "host": os.uname().nodename,
            "rank": rank,
            "local_rank": _int_env("LOCAL_RANK"),
            "world_size": world,
            "argv": [str(a)[:200] for a in sys.argv[:20]],
            "t": time.time(),
        }
    )
    try:
        _install_cuda_budget(sys.modules.get("torch.cuda"))
    except Exception as exc:  # the supervisor still judges every step's reading against the budget
        sys.stderr.write(f"isoprobe shim: cannot apply the CUDA budget ({type(exc).__name__}: {exc})\n")


# ----------------------------------------------------------------------------------------------- CUDA


def _install_cuda_budget(cuda):
    """With a budget: the CUDA budget as isoprobe's own trials mean it (``_isoprobe_cuda``, this folder's)."""
    torch = sys.modules.get("torch")
    _cuda().install(
        cuda, _int_env(CUDA_BUDGET_ENV), _int_env(CUDA_OUTSIDE_ENV), _readings(), getattr(torch, "__version__", None)
    )


def _cuda():
    """``_isoprobe_cuda``: the budget's caps and the step's CUDA readings (see its docstring)."""
    return _own("child/shim/_isoprobe_cuda")


def _readings():
    """``isoprobe.child.cuda_readings``: the budget's fraction and the readings, as isoprobe's own trials take them."""
    return _own("child/cuda_readings")


def _cuda_memory(cuda):
    """The step's readings of the worst device the process uses, or None when it uses none."""
    return _cuda().memory(cuda, _readings())


def _after_step(optimizer, args, kwargs):
    import time

    if _cuda()._state["cuda"] is None and _state["steps"] == 0:  # torch.cuda was imported after its optimizers
        try:
            _install_cuda_budget(sys.modules.get("torch.cuda"))
        except Exception:
            pass
    if not _state["saves_watched"]:
        _watch_saves()
    with _state["lock"]:
        _state["steps"] += 1
        step = _state["steps"]
        now = time.perf_counter()
        seconds = now - (_state["last"] or now)
        line = {"kind": "step", "pid": os.getpid(), "step": step, "seconds": seconds, "t": time.time()}
        line.update(_memory())
        line["forwards"] = _state["forwards"].take() if _state["forwards"] is not None else []
        line["eval_forwards"] = _state["forwards"].take_evaluations() if _state["forwards"] is not None else 0
        line.update(_state["forwards"].take_inputs() if _state["forwards"] is not None else {})
        line["saves"], _state["saves"][0] = _state["saves"][0], 0
        _write(line)
        _report_files()
    _wait_at_gate(step)
    _state["last"] = time.perf_counter()


def _forward_mark(what):
    """Where this process is in its next step: its first training forward began, or returned (a line each)."""
    import time

    _write(
        {
            "kind": "forward",
            "pid": os.getpid(),
            "step": _state["steps"] + 1,
            "returned": what == "returned",
            "t": time.time(),
        }
    )
    torch = sys.modules.get("torch")
    if _state["steps"] == 0 and what != "returned" and torch is not None and torch.cuda.is_initialized():
        _cuda().forward_began(torch.cuda)  # the retries of the script's set-up are not the batch's


def _watch_saves():
    """Count ``torch.save`` calls (a checkpoint write, a phase of the script's cycle: ``isoprobe.report.cycle``).

    Done at the first optimizer step, when torch is whole: ``torch.save`` and ``torch.serialization.save`` are then
    one function, replaced in both places by one that counts and calls it (the frameworks' savers look it up when
    they save: Lightning's ``_atomic_save``, the Trainer's ``torch.save``). A name bound before the first step
    (``from torch import save``) keeps the original: its writes are not counted, and nothing else changes."""
    _state["saves_watched"] = True
    torch = sys.modules.get("torch")
    serialization = sys.modules.get("torch.serialization")
    original = getattr(serialization, "save", None)
    if torch is None or original is None or getattr(torch, "save", None) is not original:
        return
    import functools

    counter = _state["saves"]

    @functools.wraps(original)
    def save(*args, **kwargs):
        counter[0] += 1
        return original(*args, **kwargs)

    serialization.save = save
    torch.save = save


def _wait_at_gate(step):
    """Hold this process after ``step`` until the supervisor allows more steps than that (it may never: then the
    supervisor ends the process here, between two steps, with its readings written)."""
    import time

    path = os.path.join(_state["dir"], _wiring.GATE_FILE)
    while True:
        try:
            with open(path, "rb") as gate:
                allowed = int(gate.read().strip() or b"0")
        except (OSError, ValueError):
            allowed = 0
        if step < allowed:
            return
        time.sleep(_GATE_POLL_SECONDS)


def _memory():
    """The readings isoprobe's own trials report after a step (``protocol.messages.StepDone``'s fields)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and cuda.is_initialized():
        reading = _cuda_memory(cuda)
        if reading is not None:
            return reading
    status = _own("system/proc_memory").status_bytes("VmHWM", "VmRSS", "VmData", "RssFile")
    # The data segment now (what RLIMIT_DATA counts); the supervisor raises it to the most it sampled of this
    # process's data segment during the step (isoprobe.child.command_trial.supervisor). Not VmPeak, from which
    # isoprobe's own
    # trials estimate the data peak: a malloc arena that a new thread maps reserves address space the cap never
    # counts, and a script's threads (gloo's, a DataLoader's) lifted that estimate to the cap at every batch
    # (docs/measurements.md, "Moved from code"). Not the writable shared mappings
    # either: a command's cap is what `ulimit -d` caps, and a DataLoader's workers hand their batches over in
    # shared memory that it does not count (the resident peak, which does, is still checked). The mapped files'
    # resident pages (RssFile) go with it, to be left out of that check as for isoprobe's own trials: how many of
    # the libraries' pages are resident depends on the page cache (a fresh install's are all cached, and the
    # kernel maps a faulting page's cached neighbours too), not on the batch.
    return {
        "peak_bytes": status["VmHWM"],
        "held_bytes": status["VmRSS"],
        "budget_peak_bytes": status["VmData"],
        "held_budget_bytes": status["VmData"],
        "file_resident_bytes": status["RssFile"],
        "device": "cpu",
    }


def _environment_roots():
    """Installed software's folders (its modules and files are not the user's): stdlib and site-packages."""
    import sysconfig

    roots = {sysconfig.get_paths().get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.add(os.path.dirname(os.path.abspath(__file__)))
    return tuple(sorted({os.path.join(os.path.realpath(r), "") for r in roots if r}))


def _outside(path):
    return not path.startswith(_state["roots"]) and not path.startswith(_SYSTEM_FOLDERS)


def _audit(event, args):
    """Note the files this process opens for reading (the cache's sources: a changed config probes again)."""
    if event != "open" or _state["dir"] is None:
        return
    try:
        path, mode, flags = args
        if path is None or isinstance(path, int):
            return
        reads = ("r" in mode or "+" in mode) if isinstance(mode, str) else (flags & os.O_ACCMODE) != os.O_WRONLY
        if reads and len(_state["reads"]) < 10000:
            path = os.path.abspath(os.fsdecode(os.fspath(path)))
            if _outside(path) and path not in _state["reads"]:  # the installed environment's (every import) are not
                _state["reads"].add(path)
                if _not_stepping():
                    _report_read(path)
    except Exception:
        pass


def _not_stepping():
    """Whether this process never reaches a step of its own to report its reads at: a process forked from the one
    whose hooks were registered, or a DataLoader worker (forked or spawned: torch set its worker info)."""
    if os.getpid() != _early["pid"]:
        return True
    worker = sys.modules.get("torch.utils.data._utils.worker")
    return getattr(worker, "_worker_info", None) is not None


def _report_read(path):
    """One file a process that never steps read, written now (a worker is killed with the trial, never asked)."""
    new = sorted(_own("child/native_reads").read_paths(path, _outside, _state["dir"]) - _state["reported"])
    if new:
        _state["reported"].update(new)
        _write({"kind": "files", "pid": os.getpid(), "modules": [], "reads": new})


def _report_files():
    """The user's module files and files read, outside the installed environment, that were not reported yet."""
    import itertools

    modules = set()
    names = len(sys.modules)
    for module in itertools.islice(list(sys.modules.values()), _state["modules_done"], None):
        try:
            file = getattr(module, "__file__", None) if module is not None else None
        except Exception:
            continue
        if isinstance(file, str) and file and not file.startswith(_state["roots"]):
            modules.add(os.path.realpath(file))
    _state["modules_done"] = names  # each module once: a step's cost stays the few imported since the last
    # The reads' real paths, the symbolic links on their way, and (at steps 1, 2, 4...) what native code holds.
    reads = _own("child/native_reads").step_reads(_state["reads"], _state["steps"], _audit, _outside, _state["dir"])
    new_modules = sorted(p for p in modules if _outside(p) and p not in _state["reported"])
    new_reads = sorted(reads - _state["reported"])
    if new_modules or new_reads:
        _state["reported"].update(new_modules, new_reads)
        _write({"kind": "files", "pid": os.getpid(), "modules": new_modules[:2000], "reads": new_reads[:2000]})


def report_exception(kind, value, trace, thread):
    """Write an exception that reached the top of the process (or of a thread), whenever it came."""
    try:
        _state["dir"] = _state["dir"] or os.environ.get(DIR_ENV)
        if not _state["dir"]:
            return
        import time
        import traceback

        names = [cls.__name__ for cls in getattr(kind, "__mro__", (kind,))]
        text = "".join(traceback.format_exception(kind, value, trace))[-_TRACEBACK_CHARS:]
        _write(
            {
                "kind": "exception",
                "pid": os.getpid(),
                "types": names,
                "type": f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', kind)}",
                "message": str(value)[:_MESSAGE_CHARS],
                "traceback": text,
                "thread": thread,
                "steps": _state["steps"],
                "t": time.time(),
            }
        )
    except Exception:
        pass


def _write(line):
    """One JSON line, one ``write`` on an O_APPEND descriptor of this process's own file (a fork gets its own)."""
    try:
        import json

        pid = os.getpid()
        if _state["pid"] != pid:
            _state["pid"] = pid
            _state["fd"] = os.open(
                os.path.join(_state["dir"], f"p{pid}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600
            )
        os.write(_state["fd"], json.dumps(line).encode() + b"\n")
    except Exception:
        pass


def _int_env(name):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None
