"""The real job's size, from the variables its launcher sets (torchrun, Slurm): what a spec's ranks default to.

Pure over a mapping (the caller passes ``os.environ``): the distributed probe's
world size (``executors.ranks``) and the accumulation plan's ranks
(``search.plan``) read the same job the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_POSITIVE_INTEGER = re.compile(r"[0-9]+")


def world_size_from_environment(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """The number of ranks the launcher announces, and where it came from; None when none does.

    ``WORLD_SIZE`` first: torchrun (and most launchers on top of it) set it, and
    it is the number the training process group will use. Then SLURM:
    ``SLURM_NTASKS``, else ``SLURM_NNODES`` x ``SLURM_NTASKS_PER_NODE`` when
    both are set. A value that is not a positive integer (empty, ``"0"``,
    ``"4(x2)"``) is ignored rather than trusted, and the next source is tried.
    """
    for name in ("WORLD_SIZE", "SLURM_NTASKS"):
        size = positive_integer(environ.get(name))
        if size is not None:
            return size, name
    nodes = positive_integer(environ.get("SLURM_NNODES"))
    tasks_per_node = positive_integer(environ.get("SLURM_NTASKS_PER_NODE"))
    if nodes is not None and tasks_per_node is not None:
        return nodes * tasks_per_node, "SLURM_NNODES x SLURM_NTASKS_PER_NODE"
    return None


def positive_integer(text: str | None) -> int | None:
    """``text`` as a positive integer in plain ASCII digits (surrounding blanks allowed), else None."""
    if text is None:
        return None
    stripped = text.strip()
    if not _POSITIVE_INTEGER.fullmatch(stripped):
        return None
    value = int(stripped)
    return value if value > 0 else None
