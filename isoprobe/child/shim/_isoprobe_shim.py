"""Inside the user's own processes: count optimizer steps, read memory after each, and report them.

Loaded by this folder's ``sitecustomize`` in a Python process of a command trial (the script, torchrun's ranks,
a launcher's children) only when torch imports its optimizer module, or when an exception reaches the top of
the process: a process that never imports torch loads nothing of it. Then it registers torch's global optimizer
step hooks (``register_optimizer_step_pre_hook`` / ``..._post_hook``), which see every optimizer step of every
``torch.optim.Optimizer`` in the process, whatever loop calls it (the user's, Lightning's, the Trainer's,
Accelerate's).

After each optimizer step it appends one JSON line to its own file in the trial's folder (its step, time and
memory readings, in the units of isoprobe's own trials) and then waits at the *gate* until the trial's
supervisor (``isoprobe.child.command``, which judges every process's steps as the parent judges a trial) allows
the next step. A process is never ended from here (a rank that left in a hook while the others sit in a
collective would block them): the supervisor ends the whole tree once it has seen enough. An exception that
reaches the top of a process is written too, so an out-of-memory is classified from the exception itself.

Standard library only, and small: it lives in the process that is being measured. The line formats are
``isoprobe.protocol.command``'s models (checked there, in the supervisor), written here with ``json`` alone.
"""

import os
import sys

# What the functions below import, they import when they first run: after torch has imported those modules
# anyway, so that the shim adds as little as it can to the heap it measures (see sitecustomize).

#: The trial's folder: this process's lines go to ``p<pid>.jsonl`` in it, and the supervisor's gate is ``gate``.
DIR_ENV = "ISOPROBE_SHIM_DIR"
#: CUDA: the per-rank budget in bytes, applied as the memory fraction at the first optimizer step.
CUDA_BUDGET_ENV = "ISOPROBE_SHIM_CUDA_BUDGET"
_GATE_POLL_SECONDS = 0.002
_MESSAGE_CHARS = 2000
_TRACEBACK_CHARS = 8000
_SYSTEM_FOLDERS = ("/proc/", "/sys/", "/dev/", "/run/")

_state = {"dir": None, "fd": None, "pid": None, "steps": 0, "last": None, "budget_set": False,
          "reported": set(), "reads": set(), "roots": (), "modules_done": 0, "lock": None}


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


def _watch_threads_and_reads():
    """Once torch is in: exceptions that end a thread, and the files the process opens from now on."""
    import threading

    _state["lock"] = threading.Lock()
    _state["roots"] = _environment_roots()
    previous_thread_hook = threading.excepthook

    def thread_hook(args):
        if args.exc_type is not None and not issubclass(args.exc_type, SystemExit):
            report_exception(args.exc_type, args.exc_value, args.exc_traceback, getattr(args.thread, "name", None))
        previous_thread_hook(args)

    threading.excepthook = thread_hook
    sys.addaudithook(_audit)


def _register(module):
    import time

    try:
        module.register_optimizer_step_pre_hook(_before_step)
        module.register_optimizer_step_post_hook(_after_step)
        _watch_threads_and_reads()
    except Exception as exc:  # a torch without global hooks: the trial sees no step and says why
        sys.stderr.write(f"isoprobe shim: cannot hook torch's optimizers ({type(exc).__name__}: {exc})\n")
        return
    _state["last"] = time.perf_counter()
    # RANK / WORLD_SIZE as torchrun, accelerate launch and DeepSpeed set them; else a Slurm step's task numbers.
    rank, world = _int_env("RANK"), _int_env("WORLD_SIZE")
    if rank is None and (_int_env("SLURM_STEP_NUM_TASKS") or 1) > 1:
        rank, world = _int_env("SLURM_PROCID"), _int_env("SLURM_STEP_NUM_TASKS")
    _write({"kind": "hello", "pid": os.getpid(), "ppid": os.getppid(), "rank": rank,
            "local_rank": _int_env("LOCAL_RANK"), "world_size": world,
            "argv": [str(a)[:200] for a in sys.argv[:20]], "t": time.time()})


def _before_step(optimizer, args, kwargs):
    if _state["budget_set"]:
        return
    _state["budget_set"] = True
    budget = os.environ.get(CUDA_BUDGET_ENV)
    torch = sys.modules.get("torch")
    if budget and torch is not None and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, int(budget) / total), device)


def _after_step(optimizer, args, kwargs):
    import time

    with _state["lock"]:
        _state["steps"] += 1
        step = _state["steps"]
        now = time.perf_counter()
        seconds = now - (_state["last"] or now)
        line = {"kind": "step", "pid": os.getpid(), "step": step, "seconds": seconds, "t": time.time()}
        line.update(_memory())
        _write(line)
        _report_files()
    _wait_at_gate(step)
    _state["last"] = time.perf_counter()


def _wait_at_gate(step):
    """Hold this process after ``step`` until the supervisor allows more steps than that (it may never: then the
    supervisor ends the process here, between two steps, with its readings written)."""
    import time

    path = os.path.join(_state["dir"], "gate")
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
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_reserved(device)
        return {"peak_bytes": peak, "held_bytes": torch.cuda.memory_allocated(device), "budget_peak_bytes": peak,
                "device": f"cuda:{device}"}
    status = _status("VmHWM", "VmRSS", "VmData", "RssFile")
    # The data segment now (what RLIMIT_DATA counts); the supervisor raises it to the most it sampled of this
    # process's data segment during the step (isoprobe.child.command). Not VmPeak, from which isoprobe's own
    # trials estimate the data peak: a malloc arena that a new thread maps reserves address space the cap never
    # counts, and a script's threads (gloo's, a DataLoader's) lifted that estimate to the cap at every batch
    # (measured: a torchrun rank read its whole 896 MiB budget at batch 1). Not the writable shared mappings
    # either: a command's cap is what `ulimit -d` caps, and a DataLoader's workers hand their batches over in
    # shared memory that it does not count (the resident peak, which does, is still checked). The mapped files'
    # resident pages (RssFile) go with it, to be left out of that check as for isoprobe's own trials: how many of
    # the libraries' pages are resident depends on the page cache (a fresh install's are all cached, and the
    # kernel maps a faulting page's cached neighbours too), not on the batch.
    return {"peak_bytes": status["VmHWM"], "held_bytes": status["VmRSS"], "budget_peak_bytes": status["VmData"],
            "file_resident_bytes": status["RssFile"], "device": "cpu"}


def _status(*keys):
    values = dict.fromkeys(keys)
    try:
        with open("/proc/self/status") as status:
            for line in status:
                name, _, rest = line.partition(":")
                if name in values:
                    values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return values


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
            if _outside(path):  # the installed environment's files (every import) are not kept
                _state["reads"].add(path)
    except Exception:
        pass


def _report_files():
    """The user's module files and files read, outside the installed environment, that were not reported yet."""
    import itertools

    modules = set()
    names = len(sys.modules)
    for name, module in itertools.islice(list(sys.modules.items()), _state["modules_done"], None):
        try:
            file = getattr(module, "__file__", None) if module is not None else None
        except Exception:
            continue
        if isinstance(file, str) and file and not file.startswith(_state["roots"]):
            modules.add(os.path.realpath(file))
    _state["modules_done"] = names  # each module once: a step's cost stays the few imported since the last
    reads = {os.path.realpath(path) for path in list(_state["reads"])}
    new_modules = sorted(p for p in modules if _outside(p) and p not in _state["reported"])
    new_reads = sorted(p for p in reads if _outside(p) and p not in _state["reported"] and "__pycache__" not in p
                       and not p.startswith(os.path.realpath(_state["dir"])))
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
        _write({"kind": "exception", "pid": os.getpid(), "types": names,
                "type": f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', kind)}",
                "message": str(value)[:_MESSAGE_CHARS], "traceback": text, "thread": thread,
                "steps": _state["steps"], "t": time.time()})
    except Exception:
        pass


def _write(line):
    """One JSON line, one ``write`` on an O_APPEND descriptor of this process's own file (a fork gets its own)."""
    try:
        import json

        pid = os.getpid()
        if _state["pid"] != pid:
            _state["pid"] = pid
            _state["fd"] = os.open(os.path.join(_state["dir"], f"p{pid}.jsonl"),
                                   os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(_state["fd"], json.dumps(line).encode() + b"\n")
    except Exception:
        pass


def _int_env(name):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None
