"""isoprobe: the exact largest training batch that fits, found one fresh process per trial.

Which process runs what:

    the parent (never imports torch)
        cli.py          the command line: arguments, output formats, exit codes
        spec.py         YAML -> validated ``Spec``
        probe/          the orchestration: cache -> environment check -> search -> recommendation -> Result
        search.py       the pure edge search over a trial oracle (no processes)
        executors/      the seam to processes: ``local`` (isolated children), ``scripted`` (tests)
        result.py       the ``Result`` contract; output.py, shell.py, plot.py render it
    between them
        protocol.py     typed requests (parent -> child) and events (child -> parent)
        outcomes.py     the five trial outcomes, the stop reasons, the OOM classifier
    the child (the only code that imports torch)
        child/          ``python -m isoprobe.child``: builds the workload, runs real training steps

This module stays import-light on purpose: the child imports it before torch.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
