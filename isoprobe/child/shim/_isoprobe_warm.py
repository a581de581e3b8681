"""A command's interpreter, started ahead of its trial: import what the script imports, wait, then run the script.

Started by a trial's process waiting for its request (``isoprobe.child.warm_command``) as the trial would start
the command, but as ``python [FLAGS] -c "import _isoprobe_warm; _isoprobe_warm.main()" FD -p SCRIPT`` (or ``-m
MODULE``): the same interpreter, flags, environment (the shim's ``sitecustomize`` included), working directory,
cap and session. Then, at idle priority (its session's autogroup at nice 19, given back after):

1. ``sys.path[0]`` as ``python SCRIPT`` has it (the script's folder; the working directory with ``-m``);
2. the script's top-level ``import`` statements, in order, as the trial's process read them from the script
   (``warm-imports`` in the trial's folder: parsed there, not here, so that no syntax tree is built and freed in
   the heap being measured), each run as written only if every module it names is *installed* (found, from that
   path, under the interpreter's prefixes or site-packages: never the user's own code, whose import could act on
   arguments it does not have yet); an exception skips it (the script meets it again itself);
3. ``warm-ready`` in the trial's folder; then it blocks on FD until the trial is due.

Nothing more: what a start loads beyond the script's own first lines moves the heap the script then builds, in
either direction (measured on ``tests/commands/sanity_check_first.py`` at batch 16: importing ``torch._dynamo`` with
torch, as an optimizer's construction later would, read 0.7 MiB above a cold start; parsing the script here, 0.3 MiB
below it).

The trial's process writes the variables to set (``ISOPROBE_BATCH_SIZE``) and the words after the script (with the
batch in them) and closes its end; nothing (EOF at once) means the runner is not needed: it exits. Otherwise it
sets ``sys.argv``, and runs the script in ``__main__``, as the interpreter runs ``python SCRIPT`` (``__file__``,
``__loader__``; with ``-m``, ``runpy._run_module_as_main``, what ``python -m`` itself calls). An exception that
ends the script is reported as the interpreter would (``sys.excepthook``, status 1) without this file's frames.

Standard library only, and only modules the interpreter has loaded at start: it lives in the process being
measured.
"""

import os
import sys
import time

_AUTOGROUP = "/proc/self/autogroup"


def main():
    fd, mode, target = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    started = time.perf_counter()
    nice = _autogroup_nice()
    if nice is not None and nice < 19:
        _set_autogroup_nice(19)
    module = mode == "-m"
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.realpath(target))
    imported = _preload()
    if module:
        import runpy  # noqa: F401  (before the wait: ``python -m`` has it loaded)
    if nice is not None and nice < 19:
        _set_autogroup_nice(nice)
    _ready(imported, time.perf_counter() - started)
    message = _read_all(fd)
    os.close(fd)
    if not message:
        return  # the trial went another way: this interpreter is not needed
    words = [os.fsdecode(word) for word in message.split(b"\0")]
    count = int(words[0])
    for assignment in words[1:1 + count]:
        name, _, value = assignment.partition("=")
        os.environ[name] = value
    arguments = words[1 + count:]
    shim = sys.modules.get("_isoprobe_shim")
    if shim is not None:  # its hooks went in during the imports: step 1's time counts from now, not from then
        shim.restart_clock()
    try:
        if module:
            import runpy

            sys.argv = [target, *arguments]  # runpy puts the module's file in argv[0], as ``python -m`` does
            runpy._run_module_as_main(target, alter_argv=True)
        else:
            sys.argv = [target, *arguments]
            _run_script(target)
    except SystemExit:
        raise
    except BaseException:
        kind, value, trace = sys.exc_info()
        while trace is not None and trace.tb_frame.f_code.co_filename in (__file__, _runpy_file()):
            trace = trace.tb_next
        if value is not None:
            value.__traceback__ = trace  # what the interpreter prints (and the shim's report reads) is the value's
        sys.excepthook(kind, value, trace)
        sys.exit(1)


def _run_script(path):
    """``python SCRIPT``: its code in ``__main__`` (this ``-c`` module, whose namespace is fresh), its file named."""
    import io
    from importlib.machinery import SourceFileLoader

    main_module = sys.modules["__main__"]
    namespace = main_module.__dict__
    for name in [n for n in namespace if n not in ("__name__", "__builtins__", "__doc__")]:
        del namespace[name]
    namespace.update(__file__=os.path.abspath(path), __cached__=None, __package__=None, __spec__=None,
                     __loader__=SourceFileLoader("__main__", os.path.abspath(path)))
    with io.open_code(os.path.abspath(path)) as handle:
        source = handle.read()
    code = compile(source, os.path.abspath(path), "exec", dont_inherit=True)
    del source
    exec(code, namespace)


def _preload():
    """Run the statements of ``warm-imports`` whose modules are all installed; how many ran."""
    folder = os.environ.get("ISOPROBE_SHIM_DIR")
    try:
        with open(os.path.join(folder, "warm-imports"), "rb") as handle:
            entries = handle.read().split(b"\0")
    except (OSError, TypeError):
        return 0
    roots = _installed_roots()
    ran = 0
    for entry in entries:
        names, _, statement = entry.decode("utf-8", "replace").partition("\n")
        if not statement or not all(_installed(name, roots) for name in names.split()):
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


def _installed(top, roots):
    """Whether ``import top`` from the script's path finds installed software (not the user's own code)."""
    if top in sys.builtin_module_names:
        return True
    from importlib.machinery import PathFinder

    try:
        spec = PathFinder.find_spec(top, sys.path)
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


def _runpy_file():
    module = sys.modules.get("runpy")
    return getattr(module, "__file__", None)


def _autogroup_nice():
    """This session's autogroup nice value (the runner leads its session), or None without autogroups."""
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
