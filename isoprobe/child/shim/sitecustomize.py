"""isoprobe's start-up shim for a command trial (``isoprobe.child.command``): imported by every Python process
the command starts, because this folder is first on their PYTHONPATH.

It installs ``_isoprobe_shim`` (which does nothing unless the trial's variable is set), then runs the
``sitecustomize`` this one hides, if the environment has one further along the path (Debian's system Python
ships one; a cluster's module system may add its own), so the user's process starts as it would without
isoprobe. Standard library only; nothing here may raise into the user's process.
"""

import os
import sys


def _install_and_chain():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import _isoprobe_shim

        _isoprobe_shim.install()
    except Exception as exc:  # never the user's problem: the trial reports "no optimizer step seen"
        sys.stderr.write(f"isoprobe shim: not installed ({type(exc).__name__}: {exc})\n")
    try:
        import importlib.machinery
        import importlib.util

        others = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = module
            spec.loader.exec_module(module)
    except Exception as exc:  # as site.py treats a failing sitecustomize: a warning, and the process goes on
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


_install_and_chain()
