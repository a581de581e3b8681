"""What Slurm says of the allocation's nodes, for the messages of a probe whose gangs are job steps.

A node lost under a trial (its slurmd killed, the machine gone) shows up in isoprobe first as its consequence:
Slurm cancels the job after its node timeout, and isoprobe gets SIGTERM like any cancelled job. Before, the probe
then said only "stopped by SIGTERM" (exit 143). ``executors.srun_gang`` asks here, when it is signalled mid-step
and when it finds a node's step daemon lost, which of the job's nodes Slurm no longer counts as healthy (``sinfo``:
down, drained, failing, not responding) and names them; ``pipeline.explain`` adds the same words to the result's
message (``stop_context``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Mapping

#: Node states (``sinfo %T``, without the flags it appends) of a node that is in service.
HEALTHY = {"allocated", "mixed", "idle", "completing", "planned", "reserved"}
#: How long ``sinfo`` may take: this runs while a signal ends the probe.
SINFO_SECONDS = 5.0

_context: str | None = None


def allocation_nodes(environ: Mapping[str, str]) -> str | None:
    """The job's nodes as Slurm lists them (``n[1-2]``), from its environment."""
    return environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or None


def troubled(listing: str) -> list[str]:
    """From ``sinfo -h -N -o '%N|%T|%E'`` lines, each node Slurm does not count as in service, in words (pure).
    A state ending in ``*`` means the node's slurmd does not answer."""
    found = []
    for line in listing.splitlines():
        node, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if not node or not state:
            continue
        bare = state.rstrip("*~#!%$@^-+")
        if state.endswith("*") or bare not in HEALTHY:
            answering = ", its slurmd not answering" if state.endswith("*") else ""
            said = f", reason: {reason.strip()}" if reason.strip() and reason.strip() != "none" else ""
            found.append(f"{node} is {bare}{answering}{said}")
    return found


def node_trouble(nodes: str | None, sinfo: str = "sinfo") -> list[str]:
    """Which of ``nodes`` (a Slurm node list) are out of service now, in words; [] when none, or when sinfo is
    missing or does not answer within ``SINFO_SECONDS`` (nothing more can be known)."""
    program = shutil.which(sinfo)
    if not nodes or program is None:
        return []
    try:
        listed = subprocess.run([program, "-h", "-N", "-n", nodes, "-o", "%N|%T|%E"], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=SINFO_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    return troubled(listed.stdout) if listed.returncode == 0 else []


def record_stop_context(words: str | None) -> None:
    """What the probe saw of the allocation when a signal stopped it (``stop_context``)."""
    global _context
    _context = words


def stop_context() -> str | None:
    """The words ``record_stop_context`` kept, for the result's message (``pipeline.explain``); None: nothing seen."""
    return _context


def signalled_words(environ: Mapping[str, str] | None = None, sinfo: str = "sinfo") -> str | None:
    """A stop signal came mid-step: the job's nodes Slurm counts out of service, as one sentence, or None."""
    trouble = node_trouble(allocation_nodes(os.environ if environ is None else environ), sinfo)
    if not trouble:
        return None
    return (f"Slurm counts a node of this job out of service ({'; '.join(trouble)}): a job that loses a node is "
            "cancelled by Slurm after its node timeout, which is the signal that stopped the probe; resubmit the job "
            "on healthy nodes")
