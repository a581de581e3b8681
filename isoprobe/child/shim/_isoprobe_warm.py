"""A command's interpreter, started ahead of its trial: import what the script imports, wait for the batch, go on.

The trial's process waiting for its request (``isoprobe.child.warm_command``) starts the command exactly as the
trial would (``python [FLAGS] SCRIPT ARG...`` or ``-m MODULE``: the same interpreter, flags, environment, working
directory, cap and session), but with the batch's placeholder still in its arguments, no batch variable, and
``ISOPROBE_WARM_FD`` naming a pipe. The shim's ``sitecustomize`` calls ``wait_here`` at the end of the interpreter's
start (after any ``sitecustomize`` of the environment's, before the script is read), only in that process:

1. at idle priority (its session's autogroup at nice 19, given back after): the script's top-level ``import``
   statements, in order, as the trial's process read them (``warm-imports`` in the trial's folder: parsed there,
   so that no syntax tree is built and freed in the heap being measured), each run as written only if every module
   it names is *installed* (found, from the script's folder and the path, under the interpreter's prefixes or
   site-packages: never the user's own code, whose import could act on arguments it does not have yet); an
   exception skips it (the script meets it again itself);
2. ``warm-ready`` in the trial's folder; then it blocks on the pipe until the trial is due;
3. the trial's process writes the variables to set (``ISOPROBE_BATCH_SIZE``) and the arguments with the batch in
   them; they replace the placeholders in ``sys.argv``, and the interpreter goes on as it would have: it reads,
   compiles and runs the script itself (``__main__``, tracebacks, exit status: nothing here is on the stack).
   EOF at once means the runner is not needed: the process exits before the script runs.

Why the interpreter's own start and not ``exec`` or ``runpy`` from a runner: the heap a script builds depends on
how it was started. On ``tests/commands/accelerate_script.py`` at batch 23 under 1 GiB (6 runs each), a runner that
compiled and ran the script in ``__main__`` read 0.84 MiB below ``python SCRIPT`` with or without imports ahead,
``runpy.run_path`` 0.28 MiB below, and the script's imports run here, at the interpreter's start, read as a cold
start does. Importing more than the script's own first lines moves it too (``torch._dynamo`` with torch, as an
optimizer's construction later would: 0.7 MiB above a cold start on ``tests/commands/sanity_check_first.py``).

Standard library only, and only modules the interpreter has loaded at start: it lives in the process being
measured.
"""

import os
import sys
import time

#: The variable naming the pipe the trial comes on; only the process started ahead has it (removed at once).
FD_ENV = "ISOPROBE_WARM_FD"
_AUTOGROUP = "/proc/self/autogroup"


def wait_here():
    """Import ahead, wait for the trial, set its batch; return to the interpreter's start (see the docstring)."""
    fd = int(os.environ.pop(FD_ENV))
    started = time.perf_counter()
    nice = _autogroup_nice()
    if nice is not None and nice < 19:
        _set_autogroup_nice(19)
    module = sys.argv[:1] == ["-m"]
    statements = _preload(os.getcwd() if module else os.path.dirname(os.path.realpath(sys.argv[0])))
    if nice is not None and nice < 19:
        _set_autogroup_nice(nice)
    _ready(statements, time.perf_counter() - started)
    message = _read_all(fd)
    os.close(fd)
    if not message:
        os._exit(0)  # the trial went another way: this interpreter is not needed, and runs nothing of the script
    words = [os.fsdecode(word) for word in message.split(b"\0")]
    count = int(words[0])
    for assignment in words[1:1 + count]:
        name, _, value = assignment.partition("=")
        os.environ[name] = value
    arguments = words[1 + count:]
    if len(arguments) != len(sys.argv) - 1:
        sys.stderr.write(f"isoprobe: the trial's {len(arguments)} arguments do not replace the command's "
                         f"{len(sys.argv) - 1}\n")
        os._exit(2)
    sys.argv[1:] = arguments
    shim = sys.modules.get("_isoprobe_shim")
    if shim is not None:  # its hooks went in during the imports: step 1's time counts from now, not from then
        shim.restart_clock()


def _preload(script_folder):
    """Run the statements of ``warm-imports`` whose modules are all installed, resolved as the script will resolve
    them (its folder first); how many ran."""
    folder = os.environ.get("ISOPROBE_SHIM_DIR")
    try:
        with open(os.path.join(folder, "warm-imports"), "rb") as handle:
            entries = handle.read().split(b"\0")
    except (OSError, TypeError):
        return 0
    search = [script_folder, *sys.path]
    roots = _installed_roots()
    ran = 0
    for entry in entries:
        names, _, statement = entry.decode("utf-8", "replace").partition("\n")
        if not statement or not all(_installed(name, search, roots) for name in names.split()):
            continue
        try:
            exec(compile(statement, "<isoprobe: the script's imports>", "exec"), {"__name__": "__isoprobe_warm__"})
        except BaseException:  # an import that fails here fails in the script too, where it is the script's
            continue
        ran += 1
    return ran


def _installed_roots():
    import site

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except Exception:
        pass
    return tuple(os.path.join(os.path.realpath(root), "") for root in roots if root)


def _installed(top, search, roots):
    """Whether ``import top`` from the script finds installed software (not the user's own code)."""
    if top in sys.builtin_module_names:
        return True
    from importlib.machinery import PathFinder

    try:
        spec = PathFinder.find_spec(top, search)
    except Exception:
        return False
    if spec is None:
        return False
    where = spec.origin if spec.has_location and spec.origin else next(iter(spec.submodule_search_locations or ()),
                                                                       None)
    return where is not None and os.path.realpath(where).startswith(roots)


def _ready(statements, seconds):
    folder = os.environ.get("ISOPROBE_SHIM_DIR")
    if not folder:
        return
    torch = sys.modules.get("torch")
    try:
        cuda = bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        cuda = False
    temporary = os.path.join(folder, ".warm-ready")
    with open(temporary, "w") as handle:
        handle.write(f"READY {int(cuda)} {statements} {seconds:.3f}\n")
    os.replace(temporary, os.path.join(folder, "warm-ready"))


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _autogroup_nice():
    """This session's autogroup nice value (the process leads its session), or None without autogroups."""
    try:
        if os.getsid(0) != os.getpid():
            return None
        with open(_AUTOGROUP, encoding="ascii") as handle:
            return int(handle.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _set_autogroup_nice(value):
    """A nice value of 0 or more is anyone's to set; the kernel takes one such write every 100 ms, machine-wide."""
    for _ in range(20):
        try:
            with open(_AUTOGROUP, "w", encoding="ascii") as handle:
                handle.write(str(value))
            return
        except BlockingIOError:
            time.sleep(0.03 + (os.getpid() % 7) / 100)
        except OSError:
            return
