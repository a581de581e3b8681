"""The names that wire a child process to its parent: its module, its arguments, its environment variables.

Standard library only, and apart from ``protocol`` (which re-exports them),
because the child reads them first thing, before it imports torch: whatever
it imports before torch cannot be measured apart from what torch would import
anyway, and only what is measured is credited to the CPU cap
(``child.memory.credit_own``).
"""

import resource

#: The child's module: ``python -m isoprobe.child REQUEST.json`` (cold) or ``... --wait`` (warm).
CHILD_MODULE = "isoprobe.child"
#: The child's argument that means: import first, then read the request's path from stdin.
WAIT_ARGUMENT = "--wait"
#: After ``WAIT_ARGUMENT``: import at idle priority (a spare, started beside a running trial).
IDLE_ARGUMENT = "--idle"
#: The child's argument that makes it the probe's fork server (``child.server``), then the channel's descriptor.
SERVE_ARGUMENT = "--serve"
#: The Slurm rank wrapper's (``child.srun_rank``) flag for a step started ahead of its trial: start the child at idle
#: priority, then wait for one line on stdin (srun forwards it to every rank) before handing it its request.
AHEAD_ARGUMENT = "--ahead"
#: Environment variable naming the file the child appends its events to.
EVENTS_ENV = "ISOPROBE_EVENTS"
#: Environment variable naming the child's end of the lifeline pipe (see executors.local).
LIFELINE_ENV = "ISOPROBE_LIFELINE_FD"
#: Environment variable listing (comma-separated) the modules a warm child imports before its request.
PRELOAD_ENV = "ISOPROBE_PRELOAD"
#: A line a waiting child (``WAIT_ARGUMENT``) reads on stdin before its request's path: import the modules the
#: file after the prefix names (one a line) too, report ``warm`` again, and wait on. The parent never writes a
#: request path so (its paths are absolute). How a spare started before the environment check takes on the
#: model's imports (a file, not the names: a line of up to 1000 of them could fill the pipe).
IMPORT_LINE = "import "
#: How far a CPU trial may raise its own cap (RLIMIT_DATA) above the budget, to credit what isoprobe's own
#: modules take in its process (``child.memory.credit_own``; measured 6.3 MiB after torch). The parent sets
#: the hard limit this far above the budget and the child lowers it to its credited cap before any user code
#: runs, so the allowance bounds a mismeasured credit, never what a model may take.
OWN_ALLOWANCE_BYTES = 64 * 1024 * 1024


def data_limits(budget: int, inherited_hard: int | None = None) -> tuple[int, int]:
    """RLIMIT_DATA's (soft, hard) for a trial capped at ``budget``: the hard limit ``OWN_ALLOWANCE_BYTES`` above it,
    never above ``inherited_hard`` (this process's own hard limit, read when None).

    An unprivileged process cannot raise its hard limit: asking for more fails (in a child's ``preexec_fn``:
    "Exception occurred in preexec_fn"), as it did under ``ulimit -d`` at the budget. Capped there, the
    soft limit (the budget) is at most the hard one as well; the parent refuses a budget above the
    inherited limit before any trial (``pipeline.environment``), so that is never a silent lowering.
    """
    if inherited_hard is None:
        inherited_hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    hard = budget + OWN_ALLOWANCE_BYTES
    if inherited_hard != resource.RLIM_INFINITY:
        hard = min(hard, inherited_hard)
    return min(budget, hard), hard
