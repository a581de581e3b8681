"""isoprobe's start-up shim for a command trial (``isoprobe.child.command_trial.supervisor``): imported by every
Python process
the command starts, because this folder is first on their PYTHONPATH.

Deliberately tiny: it runs before the user's code, in the process that is measured, and whatever it loads then
changes the heap the user's imports and steps build on. Measured on an Accelerate script whose own runs trained
batch 24 under 1 GiB in 6 of 6: with the whole shim module (and json, threading) loaded here, 24 ran out in 4 of
4; with a ``sitecustomize`` of one line, it trained in 3 of 3. So at start-up this only puts a finder in front of
the import system (which loads ``_isoprobe_shim``, the rest, once torch's optimizers are imported: after torch has
loaded everything the shim needs anyway) and wraps ``sys.excepthook``; then it runs the ``sitecustomize`` it hides,
if the environment has one further along the path (Debian's system Python ships one; a cluster's module system
may add its own), found by ``stat`` alone. Standard library only; nothing here may raise into the user's process.

It also notes, from the interpreter's start, the files the process opens for reading (an audit hook and a set: a
script may read its config before it imports torch, and the cache must know that file). Bytecode and the
interpreter's own folders are left out here (every import opens one), the rest is filtered by the shim, which takes
the set and the hook over once it is loaded (``_isoprobe_shim.adopt_early_reads``).

In the one process a trial's process started ahead of its trial (``ISOPROBE_WARM_FD`` set), it then waits for the
trial's batch (``_isoprobe_warm``), importing nothing of the script's, so that the interpreter runs the script
itself afterwards, from its first line, as it would have.
"""

import os
import sys

#: typing's flag without importing typing into the user's process (annotations here are strings: never evaluated).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

_OPTIMIZER_MODULE = "torch.optim.optimizer"
#: Files opened for reading before the shim was loaded (absolute paths), and the shim's hook once it is: then every
#: ``open`` goes to it (an audit hook cannot be removed, so this one stays and hands over).
_reads: "set[str]" = set()
_handler: "list[Callable[[str, tuple], object]]" = []
_PREFIXES = tuple({os.path.join(p, "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p})


def _note_open(event, args):
    if event != "open":
        return
    if _handler:
        return _handler[0](event, args)
    try:
        path, mode, flags = args
        if path is None or isinstance(path, int) or len(_reads) >= 10000:
            return
        if ("r" in mode or "+" in mode) if isinstance(mode, str) else (flags & os.O_ACCMODE) != os.O_WRONLY:
            path = os.path.abspath(os.fsdecode(path))
            if not path.endswith(".pyc") and not path.startswith(_PREFIXES):
                _reads.add(path)
    except Exception:
        pass


class _IsoprobeOptimizerFinder:
    """Waits for torch's optimizer module; then ``_isoprobe_shim`` registers the step hooks. Finds nothing itself."""

    def find_spec(self, name, path=None, target=None):
        if name != _OPTIMIZER_MODULE:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            import _isoprobe_shim

            _isoprobe_shim.adopt_early_reads(_reads, _handler)
            return _isoprobe_shim.hooked_spec(name, path)
        except Exception as exc:  # never the user's problem: the trial reports "no optimizer step seen"
            sys.stderr.write(f"isoprobe shim: not installed ({type(exc).__name__}: {exc})\n")
            return None


def _report_and_raise(kind, value, trace, previous=sys.excepthook):
    try:
        import _isoprobe_shim

        _isoprobe_shim.report_exception(kind, value, trace, None)
    except Exception:
        pass
    previous(kind, value, trace)


def _start():
    if os.environ.get("ISOPROBE_SHIM_DIR"):
        sys.meta_path.insert(0, _IsoprobeOptimizerFinder())
        sys.excepthook = _report_and_raise
        sys.addaudithook(_note_open)
    _run_hidden_sitecustomize()
    if os.environ.get("ISOPROBE_WARM_FD"):  # this process was started ahead of its trial: wait for it here
        try:
            import _isoprobe_warm

            _isoprobe_warm.wait_here()
        except BaseException as exc:  # never run the script with its placeholders: the trial starts it cold
            sys.stderr.write(f"isoprobe: the command started ahead could not wait ({type(exc).__name__}: {exc})\n")
            os._exit(70)


def _run_hidden_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        for entry in sys.path:
            folder = os.path.abspath(entry or os.curdir)
            if folder == here:
                continue
            candidate = os.path.join(folder, "sitecustomize.py")
            if os.path.isfile(candidate):
                bootstrap = sys.modules["_frozen_importlib_external"]
                spec = bootstrap.spec_from_file_location("sitecustomize", candidate)
                module = sys.modules["_frozen_importlib"].module_from_spec(spec)
                sys.modules["sitecustomize"] = module
                spec.loader.exec_module(module)
                return
    except Exception as exc:  # as site.py treats a failing sitecustomize: a warning, and the process goes on
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


_start()
