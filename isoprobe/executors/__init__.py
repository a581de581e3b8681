"""The seam between the probe and processes: an executor runs one request and reports what the child left.

The probe never starts a process itself. It hands an executor a request (a
trial or the environment check, ``isoprobe.protocol.messages``) and the *conditions*
the process must be started under (backend, allocator setting, memory cap,
what to import ahead), and gets back a ``ChildRun``: the child's typed events,
its exit status, whether it timed out, the tail of its stderr. Classifying that
into an outcome is the probe's job (``isoprobe.pipeline.classify``), so every
executor's runs are judged by the same rules.

Executors:

- ``local.LocalExecutor``: one isolated child process per request on this
  machine (own session, rlimits, a keeper that kills everything it started
  and holds the lifeline, a warm spare). The default.
- ``gang.GangExecutor``: a distributed trial (``spec.distributed``) as a gang
  of rank processes, each one of the local executor's children; the first
  rank that fails ends the gang at once. Other requests pass through.
- ``srun_gang.SrunGangExecutor``: a gang trial as one Slurm job step over
  the allocation's nodes (``distributed.launcher``), judged by the same rule.
- ``scripted.ScriptedExecutor``: canned child runs from a script, no process
  and no torch, for testing the orchestration (retries, confirmations,
  reclassification, interrupts) as plain unit tests.

Their parts:

- ``processes``: a child's environment, its start, its deadlines, its stderr.
- ``child_process``: one started child, from its start until it is gone (``stop_child``).
- ``rounds``: requests run to their end, one at a time or several at once.
- ``fork_server_channel``: the parent's side of the fork server (``child.server``): start it, order forks.
- ``fork_server_choice``: which fork server forks a request, and when this probe stops forking.
- ``srun_plan`` (pure): the launcher, the ``srun`` command, Slurm's refusals; ``srun_launch``: a trial's job
  step started (srun under its keeper); ``srun_step``: one trial's job step as the executor sees it;
  ``srun_nodes``: what Slurm says of the allocation's nodes (and the errors that name them).

What a new executor must provide is the three methods of ``Executor``. One
that runs several trials at once, a gang of ranks per trial, or a trial as a
cluster job fits behind the same interface: the search and the probe do not
change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from isoprobe.protocol.messages import InspectRequest, TrialRequest


@dataclass(frozen=True)
class Conditions:
    """How a child's process is started, as opposed to what it is asked to do (its request).

    Two requests under equal conditions can share a process started ahead of
    time (a warm spare); under different ones they cannot.
    """

    backend: Literal["cpu", "cuda"]
    #: PYTORCH_CUDA_ALLOC_CONF for the child: None inherits isoprobe's own environment, '' removes it
    #: (torch's default), anything else is set.
    allocator: str | None = None
    #: CPU backend: the RLIMIT_DATA cap in bytes. None: no cap.
    memory_limit: int | None = None
    #: Modules a process started ahead imports before its request arrives (nothing that touches a device).
    preload: tuple[str, ...] = ()
    #: OMP_NUM_THREADS for the child, set before it imports anything (a gang's ranks: as torchrun starts them,
    #: ``ranks.resolve_threads_per_rank``). None: as isoprobe's own environment has it. Set at exec, not
    #: later: a rank told ``torch.set_num_threads(1)`` after its imports held 42 MB more (measured) than one
    #: started with the variable, as torchrun starts it.
    threads: int | None = None
    #: A command probe's plan for starting the next trial's command ahead (``protocol.warm_command.WarmPlan`` as
    #: JSON): a process started ahead starts the command too. None: the command starts when its trial is due.
    command_plan: str | None = None


@dataclass(frozen=True)
class ChildRun:
    """Everything a finished child left behind."""

    returncode: int
    timed_out: bool
    seconds: float
    events: list = field(default_factory=list)  # isoprobe.protocol.messages events, in the order written
    stderr_tail: str = ""
    oom_kills: int | None = None  # OOM kills the child's memory cgroup counted during the run; None: unknown
    warm: bool = False  # the child was started ahead (a spare): its imports were off the critical path
    #: Only with ``timed_out``: the child had written a complete verdict (a trial's result, the environment
    #: check's report) when its deadline came, and was killed on its way out. False: no verdict by the deadline.
    verdict_at_timeout: bool = False
    forked: bool = False  # forked from the executor's fork server (``warm`` too)
    #: A gang (``spec.distributed``): every rank's own run, in rank order. The fields above are then those of
    #: the rank that decides the trial: the first that failed, else rank 0.
    ranks: tuple[ChildRun, ...] = ()
    #: A gang: the rank whose failure ended the trial (the others were killed for it); None when none failed.
    failed_rank: int | None = None
    #: A gang with a failed rank: seconds from seeing that failure to every rank's process tree being gone.
    gang_stop_seconds: float | None = None
    #: Why this run's end is unknown because isoprobe's own machinery failed (the fork server that would report
    #: it was lost or wedged), not the trial: such a run is re-run, never classified (``pipeline.classify``).
    lost: str | None = None
    #: Why each earlier attempt at this same request was lost (and re-run): what the progress says happened.
    lost_before: tuple[str, ...] = ()
    #: A rank run as a Slurm job step's task (``executors.srun_gang``): the node it ran on (SLURMD_NODENAME).
    node: str | None = None
    #: Seconds its timeout was extended because a busy node kept its tree from the CPU (``rounds.BusyClock``).
    busy_seconds: float = 0.0
    #: Only with ``timed_out``: it was still starved when it timed out, the extensions used up: the node was busy.
    busy_at_timeout: bool = False


class Executor(Protocol):
    """Runs requests in fresh processes. Used as a context manager: nothing it started outlives ``close``."""

    def prestart(self, conditions: Conditions) -> None:
        """A hint: the next trials will run under ``conditions`` (an executor may start a process ahead)."""

    def run(
        self, request: TrialRequest | InspectRequest, conditions: Conditions, *, timeout: float, name: str
    ) -> ChildRun:
        """Run one request to its end (or kill it ``timeout`` seconds after the request reached a process that
        had finished its imports) and return what it left behind.

        KeyboardInterrupt and ``errors.Terminated`` pass through, after whatever
        the executor started for this request is gone.
        """

    def close(self) -> None:
        """Stop everything still running or waiting."""


def run_through_reporting(executor, request, conditions: Conditions, *, timeout: float, name: str) -> ChildRun:
    """``run`` for an executor whose own primitive is ``run_reporting`` (the gangs): the one run it hands over."""
    runs: list[ChildRun] = []
    executor.run_reporting(request, conditions, timeout=timeout, name=name, finished=runs.append)
    return runs[0]
