"""isoprobe: the exact largest training batch that fits, found one fresh process per trial.

Which process runs what:

    the parent (never imports torch)
        cli.py          the command line: arguments, output formats, exit codes
        spec.py         the ``Spec`` models; spec_load.py: YAML (and overrides) -> validated ``Spec``
        probe/          the orchestration: cache -> environment check -> search -> recommendation -> Result
        search*.py      the pure edge search over a trial oracle (no processes): history, steps, plan
        executors/      the seam to processes: ``local`` (isolated children), ``scripted`` (tests)
        result.py       the ``Result`` contract; output.py, shell.py, plot.py render it
    between them
        protocol.py     typed requests (parent -> child) and events (child -> parent)
        outcomes.py     the five trial outcomes, the stop reasons, the OOM classifier
    the child (the only code that imports torch)
        child/          ``python -m isoprobe.child``: builds the workload, runs real training steps

The Python API (``api.py``)::

    from isoprobe import probe, load_spec, SpecError
    result = probe("spec.yaml", memory_budget="8GiB")   # a Result; never imports torch here

This module stays import-light on purpose: the child imports it before torch,
and ``import isoprobe`` must stay fast for the CLI and for scripts. So the names
below are imported on first use (module ``__getattr__``), not here.
"""

__version__ = "0.1.0"

#: The public names, and the module each comes from (imported when first asked for). ``probe`` is apart: below.
_LAZY = {
    "load_spec": "isoprobe.spec_load",
    "Spec": "isoprobe.spec",
    "Result": "isoprobe.result",
    "StopReason": "isoprobe.outcomes",
    "IsoprobeError": "isoprobe.errors",
    "SpecError": "isoprobe.errors",
    "ProbeError": "isoprobe.errors",
    "Problem": "isoprobe.errors",
}

__all__ = ["__version__", "probe", *_LAZY]


def __getattr__(name: str):
    """``isoprobe.load_spec`` and the rest on first use; each is then kept in this module's namespace."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Probe:
    """``isoprobe.probe``: the API function ``isoprobe.api.probe`` when called, the subpackage otherwise.

    The name has two owners: the public function (``from isoprobe import probe``)
    and the orchestration's subpackage ``isoprobe/probe/``, which the import system
    records as this package's attribute ``probe`` whenever it is imported (as the
    API itself does). So the attribute is this object, always (``_Package``): a
    call is the API's (its signature and docstring too, through ``__wrapped__``),
    and any other name is looked up in the subpackage (``isoprobe.probe.answer``,
    ``isoprobe.probe.run_probe``, what ``monkeypatch.setattr("isoprobe.probe....")``
    resolves), so code written for either meaning keeps working.
    """

    def __call__(self, *args, **kwargs):
        from isoprobe.api import probe

        return probe(*args, **kwargs)

    @property
    def __wrapped__(self):  # inspect.signature and functools follow it to the function
        from isoprobe.api import probe

        return probe

    @property
    def __doc__(self):  # noqa: D105 - the function's own
        return self.__wrapped__.__doc__

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        import importlib

        package = importlib.import_module("isoprobe.probe")
        try:
            return getattr(package, name)
        except AttributeError:
            pass
        try:
            return importlib.import_module(f"isoprobe.probe.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"isoprobe.probe has no attribute {name!r}") from None

    def __repr__(self) -> str:
        return "<function isoprobe.probe (isoprobe.api.probe)>"


def _install() -> None:
    """Give this module the ``probe`` attribute that the subpackage's import cannot replace."""
    import sys
    from types import ModuleType

    callable_probe = _Probe()

    class _Package(ModuleType):
        @property
        def probe(self):
            return callable_probe

        @probe.setter
        def probe(self, value):
            """The import system records the subpackage here: it stays in sys.modules and behind ``_Probe``."""

    sys.modules[__name__].__class__ = _Package


_install()
