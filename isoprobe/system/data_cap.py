"""The CPU cap (``RLIMIT_DATA``): the one place that computes and sets it, for every process a trial runs.

Standard library only: the executors set it before exec (``executors.processes.prepare_child``), a fork of the
server sets it on itself (``set_data_cap``), a Slurm rank's wrapper sets it before exec (``child/srun_rank.py``,
which loads this file by path, isolated), the child credits isoprobe's own modules to it (``credit``), and a
command trial caps the user's command at the budget itself (``set_exact``).

The hard limit is ``OWN_ALLOWANCE_BYTES`` above the budget: room for the child to credit what isoprobe's own
modules take in its process (``child.own_modules``), which it does, and then fixes both limits before any user
code runs. Never above the hard limit the process inherited: raising it needs a privilege a user under
``ulimit -d`` does not have.
"""

import resource

#: How far a CPU trial may raise its own cap above the budget, to credit what isoprobe's own modules take in its
#: process (``child.own_modules``; figure: docs/measurements.md). The parent sets the hard limit this far above the
#: budget and the child lowers it to its credited cap before any user code runs, so the allowance bounds a
#: mismeasured credit, never what a model may take.
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


def within_inherited(soft: int, hard: int) -> tuple[int, int]:
    """(soft, hard) as a parent on another node computed them (``data_limits``), lowered to this process's own hard
    limit where it has one (Slurm propagates the submitting shell's limits): raising it needs a privilege."""
    inherited = resource.getrlimit(resource.RLIMIT_DATA)[1]
    if inherited != resource.RLIM_INFINITY:
        hard = min(hard, inherited)
    return min(soft, hard), hard


def set_limits(soft: int, hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def set_data_cap(budget: int) -> None:
    """Cap this process as the parent caps a spawned child: ``budget``, with the hard limit ``OWN_ALLOWANCE_BYTES``
    above it for ``credit``, at most the hard limit it inherited."""
    set_limits(*data_limits(budget))


def set_exact(budget: int) -> None:
    """Cap this process at ``budget``, soft and hard: a command's processes (no credit to give them)."""
    set_limits(budget, budget)


def credit(amount: int) -> None:
    """Raise this process's cap by ``amount`` (what isoprobe holds of its own), at most its hard limit, and make it
    final (both limits set to it): nothing run later can raise it. Without a cap there is nothing to credit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if soft == resource.RLIM_INFINITY:
        return
    cap = soft + amount if hard == resource.RLIM_INFINITY else min(soft + amount, hard)
    set_limits(cap, cap)


def budget_of(credited: int = 0) -> int | None:
    """This process's cap (the soft limit) less ``credited``: the budget, or None without a cap."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return None if soft == resource.RLIM_INFINITY else soft - credited
