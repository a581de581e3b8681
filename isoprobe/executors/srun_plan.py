"""A gang trial as one Slurm job step: which launcher, the ``srun`` command, and Slurm's refusals (pure).

Pure (no process, no file), so the command a trial's step runs, the ``auto``
rule and what counts as Slurm refusing a step are unit-tested from an
allocation's environment alone; ``executors.srun_gang`` runs what this plans.

Why a job step: a job larger than one node runs its ranks on every node of
the allocation, and Slurm already starts, places and kills such processes
(``srun``). Each trial is a new step, so every rank is a fresh process, as a
local rank is. The ranks meet through a ``FileStore`` in the trial's folder,
which must be on a filesystem every node of the allocation sees: a file
store needs no free port on the first node, and two probes in one allocation
cannot meet each other's ranks (the same reason the local gang uses one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from isoprobe.protocol.wiring import AHEAD_ARGUMENT

#: The module every rank runs through the standalone loader (``rank_entry``: ``system/standalone.py``).
RANK_MODULE = "child/srun_rank"

#: The step's name in ``squeue -s``: what a person sees beside their own steps.
STEP_NAME = "isoprobe-trial"

#: Lines of srun's stderr that mean Slurm refused (or could not place) the step: no rank ran, so the batch has
#: no outcome. From Slurm 22.05's srun (``Unable to create step``, ``launch failed``) and slurmctld's errors.
REFUSALS = (
    "Unable to create step",
    "Requested node configuration is not available",
    "More processors requested than permitted",
    "Memory required by task is not available",
    "Job/step already completing or completed",
    "Invalid job id specified",
    "Access/permission denied",
    "Application launch failed",
    "Task launch for StepId",
    "Node count specification invalid",
    "Unable to confirm allocation",
)


#: The Slurm client commands a probe whose gangs are job steps runs: ``srun`` starts each step, ``scancel`` ends
#: it (and srun's keeper runs it if isoprobe dies), ``squeue -s`` says when it is gone (``executors.srun_gang``).
SLURM_CLIENTS = ("srun", "scancel", "squeue")


class LauncherError(ValueError):
    """A launcher that cannot run here: what is wrong, and the fix (rendered as a spec error, exit 2)."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation isoprobe runs in, from its environment (``None`` fields: not said)."""

    job_id: str | None
    nodes: int | None
    tasks: int | None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Allocation:
        nodes = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
        return cls(
            job_id=environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or None,
            nodes=_count(nodes),
            tasks=_count(environ.get("SLURM_NTASKS")),
        )


@dataclass(frozen=True)
class LauncherChoice:
    """The launcher a probe's gangs use (``local`` or ``srun``), and why, for the progress and the result."""

    launcher: str
    reason: str


def choose_launcher(
    asked: str, allocation: Allocation, wanted_ranks: int, node_ranks: int, missing_clients: tuple[str, ...] = ()
) -> LauncherChoice:
    """``distributed.launcher`` resolved: ``local`` or ``srun``; ``LauncherError`` for srun outside an allocation,
    or where ``missing_clients`` (those of ``SLURM_CLIENTS`` not on PATH, looked up by the caller) leaves it unable
    to run a step: both are known in the parent before the environment check, so they are refused before it.

    ``wanted_ranks``: the spec's world size, else the job's (``WORLD_SIZE``,
    ``SLURM_NTASKS``...), else 1. ``node_ranks``: the most ranks this node runs
    (its visible GPUs; on the CPU what its RAM holds at the budget). ``auto``
    picks srun only inside an allocation whose ranks do not fit this node: one
    of more than one node (a job on several nodes runs its ranks on all of them),
    or one asking more ranks than this node runs. A one-node job stays local:
    the same ranks, without a step's start-up.
    """
    if asked == "local":
        return LauncherChoice("local", "distributed.launcher: local")
    if allocation.job_id is None:
        if asked == "srun":
            raise LauncherError(
                "srun: a job step needs a Slurm allocation, and SLURM_JOB_ID is not set",
                "run isoprobe inside the job (its batch script, or an salloc shell), or set "
                "distributed.launcher: local (or auto)",
            )
        return LauncherChoice("local", "auto: not in a Slurm allocation")
    if asked == "srun":
        choice = LauncherChoice("srun", f"distributed.launcher: srun, in job {allocation.job_id}")
    elif (allocation.nodes or 1) > 1:
        choice = LauncherChoice("srun", f"auto: job {allocation.job_id} has {allocation.nodes} nodes")
    elif wanted_ranks > node_ranks:
        choice = LauncherChoice("srun", f"auto: {wanted_ranks} ranks are more than this node runs ({node_ranks})")
    else:
        return LauncherChoice("local", f"auto: job {allocation.job_id}'s {wanted_ranks} rank(s) fit this node")
    if missing_clients:
        chose = "" if asked == "srun" else f" (auto chose srun: {choice.reason.removeprefix('auto: ')})"
        are = "is" if len(missing_clients) == 1 else "are"
        raise LauncherError(
            f"srun{chose}: each trial is a Slurm job step, and {', '.join(missing_clients)} {are} not on PATH here",
            "run isoprobe where Slurm's client commands (srun, scancel, squeue) are on PATH (in the "
            "job, outside a container that lacks them), or set distributed.launcher: local",
        )
    return choice


def srun_command(
    *,
    world_size: int,
    nodes: int | None,
    step_dir: str,
    python: str,
    rank_entry: str,
    data_limits: tuple[int, int] | None,
    cuda: bool,
    ahead: bool = False,
) -> list[str]:
    """The one ``srun`` that runs a trial's ranks, each through ``child.srun_rank`` (its cap, its files, its GPU).

    ``--kill-on-bad-exit=1``: a rank that ends badly (a crash, a kill) ends the
    step on every node at once. ``--nodes``: the allocation's nodes, at most one
    a rank. ``--wait=0``: no grace for the others after the first task exits
    (the supervisor decides when the gang is over). Each rank's stdout and
    stderr go to its own file in the step's folder (``%t``: the task's rank).
    CUDA: one GPU a rank (``--gpus-per-task=1``), bound by Slurm. The ranks
    inherit srun's environment (``--export=ALL``), which the executor made as a
    local child's (``processes.child_environment``).

    ``ahead``: the step of the next trial, started while the current one runs
    (``distributed.steps_ahead``). ``--overlap`` lets it start beside the running
    step on the same CPUs and GPUs (its ranks only import, at idle priority,
    and touch no device until their turn); ``--input=all`` forwards srun's
    stdin to every rank, which is how the ranks learn that their requests are
    written: one line, through Slurm's own connection to each node, rather
    than a file polled on a shared filesystem whose lookups a node may cache.
    """
    argv = [
        "srun",
        f"--ntasks={world_size}",
        "--kill-on-bad-exit=1",
        f"--job-name={STEP_NAME}",
        "--wait=0",
        "--export=ALL",
        "--input=all" if ahead else "--input=none",
        f"--output={step_dir}/rank%t.stdout",
        f"--error={step_dir}/rank%t.stderr",
    ]
    if ahead:
        argv.append("--overlap")
    if nodes is not None:
        argv.append(f"--nodes={max(1, min(nodes, world_size))}")
    if cuda:
        argv.append("--gpus-per-task=1")
    entry = [python, "-I", "-S", rank_entry, RANK_MODULE] + ([AHEAD_ARGUMENT] if ahead else []) + [step_dir]
    if data_limits is not None:  # RLIMIT_DATA's soft and hard limits, as processes.prepare_child sets them
        entry += [str(data_limits[0]), str(data_limits[1])]
    return argv + entry


#: Lines of srun's stderr that mean Slurm lost a step it had started: a node failed or was set down under it, or a
#: task could not be launched on its node. What the ranks then show (killed, never started) is Slurm's doing, not
#: the batch's, so the step counts as refused. Measured on the two-node test cluster (Slurm 22.05): a node set DOWN
#: mid-step prints "srun: error: Node failure on n2" and kills the other node's ranks; a step whose output file a
#: node cannot create (a trial folder that node does not see) prints "srun: error: task 1 launch failed: Slurmd
#: could not connect IO", and srun then waits with the other ranks alive until it is cancelled.
LOSSES = ("Node failure on", "launch failed")


def refusal(srun_stderr: str) -> str | None:
    """The line of srun's stderr that says Slurm refused the step, or None (the step ran, or no such line)."""
    for line in srun_stderr.splitlines():
        if any(marker in line for marker in REFUSALS):
            return line.strip()
    return None


def _count(value: str | None) -> int | None:
    """A Slurm count ("2", or "2(x3)" lists are not counts here): a positive int, else None."""
    if value is None or not value.strip().isdigit():
        return None
    number = int(value)
    return number if number > 0 else None


def loss(srun_stderr: str) -> str | None:
    """The line of srun's stderr that says Slurm lost a step it had started (``LOSSES``), or None."""
    for line in srun_stderr.splitlines():
        if any(marker in line for marker in LOSSES):
            return line.strip()
    return None


def node_failed(words: str) -> bool:
    """Whether Slurm's ``words`` say a node of the allocation failed: it is then out of the job for good (slurmctld
    "Removing failed node n2 from JobId=..."), so asking for the step again cannot help."""
    return "Node failure" in words


def advice(words: str, trial_folders: str) -> str:
    """What to do about a step Slurm refused or lost, from Slurm's ``words``; ``trial_folders``: where the trials'
    folders are (under TMPDIR)."""
    if node_failed(words):
        return (
            "A node of the allocation failed or was set down while a trial ran (sinfo lists it): resubmit the job "
            "on healthy nodes"
        )
    if "could not connect IO" in words or "launch failed" in words:
        return (
            f"A rank could not be started on its node. The trial folders are under TMPDIR ({trial_folders}), "
            "and every rank opens its files there: TMPDIR must be a folder every node of the allocation sees (a "
            "shared filesystem, not a node-local /tmp): export TMPDIR=/a/shared/folder before isoprobe"
        )
    return (
        "Ask for the ranks the job has (SLURM_NTASKS), check the nodes with sinfo, or set distributed.launcher: local"
    )
