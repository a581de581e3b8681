"""Whether the SIGTERM that stopped isoprobe is its Slurm job's time limit, and the message that says so.

A job whose time limit falls mid-probe is ended by Slurm: SIGTERM to every process of the job, then SIGKILL
after KillWait (30 s by default). isoprobe prints its document within that (exit 143), and its message should
say why the SIGTERM came rather than only that it came: "stopped by SIGTERM: the Slurm job's time limit
(01:00:00) was reached before an answer; raise ...".

Slurm is asked once, when the message is made, and only inside a job (``SLURM_JOB_ID``): ``scontrol show job -o``,
at most ``SCONTROL_SECONDS``. Measured on Slurm 22.05 (the test cluster; a batch job with ``--time=1`` whose
script traps SIGTERM and asks there): slurmctld marks the job before it has its processes signalled, so at the
SIGTERM ``scontrol`` already says ``JobState=COMPLETING Reason=TimeLimit ... TimeLimit=00:01:00`` (``squeue -o
%T|%L|%r``: ``COMPLETING|INVALID|TimeLimit``); each answered in 0.01 s. Slurm 22.05 puts no
``SLURM_JOB_END_TIME`` in the job's environment, so there is nothing cheaper to read. A SIGTERM for any other
reason (``scancel``, a node lost: ``executors.srun_nodes``) leaves the message as it was.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping

from isoprobe.system.primitives import ask_slurm

#: How long ``scontrol`` may take: it runs between the SIGTERM and the document, inside Slurm's KillWait.
SCONTROL_SECONDS = 2.0

#: What the message suggests when the time limit stopped the probe.
TIME_LIMIT_FIX = (
    "raise the job's --time, or probe once in a job of its own: the answer is cached, and the next job "
    "reads it from the cache in under a second"
)

_FIELD = r"(?:^|\s){}=(\S*)"


def time_limit_reached(environ: Mapping[str, str] | None = None, scontrol: str = "scontrol") -> str | None:
    """The job's time limit as Slurm writes it (``00:01:00``, ``1-00:00:00``) when Slurm says the job is ending
    because it was reached; None outside a Slurm job, and when scontrol is missing, fails, takes longer than
    ``SCONTROL_SECONDS`` or says another reason."""
    environ = os.environ if environ is None else environ
    job = environ.get("SLURM_JOB_ID", "").strip()
    program = shutil.which(scontrol, path=environ.get("PATH")) if job.isdigit() else None
    if program is None:
        return None
    shown = ask_slurm([program, "show", "job", "-o", job], SCONTROL_SECONDS, env=environ)
    return limit_if_reached(shown.stdout) if shown is not None and shown.returncode == 0 else None


def limit_if_reached(record: str) -> str | None:
    """From ``scontrol show job -o`` (one line a job), the time limit when the job ends for it (``Reason=TimeLimit``
    or ``JobState=TIMEOUT``; '' if the line does not give it), else None (pure)."""
    line = record.strip().splitlines()[0] if record.strip() else ""
    reason = re.search(_FIELD.format("Reason"), line)
    state = re.search(_FIELD.format("JobState"), line)
    limit = re.search(_FIELD.format("TimeLimit"), line)
    if not ((reason and reason.group(1) == "TimeLimit") or (state and state.group(1) == "TIMEOUT")):
        return None
    return limit.group(1) if limit else ""


def signal_stop(signal_name: str, when: str, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The start and the end of a message for a stop by ``signal_name`` (SIGINT, SIGTERM) ``when`` (``before an
    answer``, ``before the first trial``): ('stopped by SIGTERM before an answer', '') or, where the job's time
    limit sent it, ('stopped by SIGTERM: the Slurm job's time limit (00:01:00) was reached before an answer',
    '; ' + ``TIME_LIMIT_FIX``). The caller puts what it knows (the largest batch so far) between the two."""
    limit = time_limit_reached(environ) if signal_name == "SIGTERM" else None
    if limit is None:
        return f"stopped by {signal_name} {when}", ""
    shown = f" ({limit})" if limit else ""
    return f"stopped by SIGTERM: the Slurm job's time limit{shown} was reached {when}", f"; {TIME_LIMIT_FIX}"
