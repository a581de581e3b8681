"""isoprobe: the exact largest training batch that fits, found one fresh process per trial.

The pipeline, one module per stage:

    spec.py        YAML -> validated ``Spec``            (parent, no torch)
    search.py      pure edge search over a trial oracle  (parent, no torch, no processes)
    supervisor.py  one child process per trial           (parent, no torch)
    child.py       the trial itself: real training steps (child, imports torch)
    result.py      the ``Result`` contract                (shared)
    output.py      JSON on stdout, progress on stderr    (parent)

``probe.py`` wires them together; ``cli.py`` is the command line.
This module stays import-light on purpose: the child imports it before torch.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
