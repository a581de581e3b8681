"""One trial's Slurm job step as the executor sees it: srun under its keeper, the ranks' files, how each rank ended.

Split from ``executors.srun_gang`` (which supervises and ends steps; ``srun_launch`` starts them): this is the
bookkeeping, what a step's folder and srun's stderr say, each rank's run (``rank_run``) and the rule that turns the
ranks' ends into the gang's (``step_states``). It runs no process itself.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from isoprobe.executors import ChildRun, Conditions
from isoprobe.executors.gang import first_failure
from isoprobe.executors.processes import stderr_tail
from isoprobe.executors.srun_plan import loss
from isoprobe.protocol.messages import TrialResult, last_of, read_events


@dataclass
class _Step:
    """One trial's step while it runs: srun under its keeper, and the step's folder.

    ``turn``: for a step started ahead, the pipe to srun's stdin, which srun
    forwards to every rank (a line: the requests are written; end of file:
    not needed); ``key``: what it was started for (``_ahead_key``)."""

    folder: Path
    world: int
    process: subprocess.Popen
    lifeline_write: int
    began: float
    delivered: float | None = None
    stderr_size: int = 0
    loss_words: str | None = None
    turn: IO[bytes] | None = None
    key: tuple | None = None
    armed: bool = False  # its scancel written for srun's keeper (``_arm_cancel``)
    daemon_lost: dict | None = None  # a rank's record of its node's step daemon lost (``lost_daemon``)

    def files(self, rank: int) -> dict[str, Path]:
        stem = self.folder / f"rank{rank}"
        return {
            name: Path(f"{stem}.{name}")
            for name in ("request.json", "events.jsonl", "task.json", "exit", "stderr", "lost")
        }

    def task(self, rank: int) -> dict | None:
        """What the rank's wrapper recorded when it started (node, job, step), or None: not started (yet)."""
        try:
            return json.loads(self.files(rank)["task.json"].read_text())
        except (OSError, ValueError):
            return None

    def lost_daemon(self) -> dict | None:
        """A rank's wrapper's record that its node's step daemon (slurmstepd) ended under the step (``rankN.lost``,
        written by ``child.srun_rank``): its rank, node and the daemon's pid; None while every daemon is there."""
        if self.daemon_lost is None:
            for rank in range(self.world):
                try:
                    record = json.loads(self.files(rank)["lost"].read_text())
                except (OSError, ValueError):
                    continue
                self.daemon_lost = {"rank": rank, **(record if isinstance(record, dict) else {})}
                break
        return self.daemon_lost

    def exit_code(self, rank: int) -> int | None:
        try:
            return int(self.files(rank)["exit"].read_text())
        except (OSError, ValueError):
            return None

    def step_id(self) -> str | None:
        """``JOB.STEP`` as the ranks' environment gave it (None before any rank started)."""
        for rank in range(self.world):
            task = self.task(rank)
            if task and task.get("job_id") and task.get("step_id") is not None:
                return f"{task['job_id']}.{task['step_id']}"
        return None

    def srun_stderr(self) -> str:
        return stderr_tail(self.folder / "srun.stderr")

    def lost(self) -> str | None:
        """Slurm's words if it lost the step (a node failed, a task could not be launched), else None. Read again
        only when srun's stderr has grown: this runs at every poll."""
        try:
            size = (self.folder / "srun.stderr").stat().st_size
        except OSError:
            return None
        if size != self.stderr_size:
            self.stderr_size = size
            self.loss_words = loss(self.srun_stderr())
        return self.loss_words


def _ahead_key(world: int, conditions: Conditions, cuda: bool) -> tuple:
    """What a step started ahead must have been started for to run a trial: its ranks, their conditions, the device."""
    return (world, conditions, cuda)


def _close_turn(step: _Step) -> None:
    if step.turn is not None:
        try:
            step.turn.close()
        except OSError:
            pass
        step.turn = None


def rank_run(step: _Step, rank: int, seconds: float, timed_out: bool) -> ChildRun:
    """What one rank of an ended step left, as a local rank's run (a rank without an exit file: killed, -9)."""
    files = step.files(rank)
    events = read_events(files["events.jsonl"])
    code = step.exit_code(rank)
    task = step.task(rank) or {}
    return ChildRun(
        returncode=code if code is not None else -9,
        timed_out=timed_out,
        seconds=seconds,
        events=events,
        stderr_tail=stderr_tail(files["stderr"]),
        verdict_at_timeout=timed_out and last_of(events, TrialResult) is not None,
        node=task.get("node"),
    )


def step_states(events: list[list], exits: list[int | None], srun_ended: bool) -> list[tuple]:
    """Each rank's (verdict, ended, exit code) for ``gang.first_failure``, from what the step's ranks left.

    A rank's own end is its exit file (``child.srun_rank``). A rank without one
    once srun has ended was killed with the step (``--kill-on-bad-exit``, a
    cancel): it ended, but by another's failure, so it is counted as ended only
    when no rank ended on its own with a failure; else a peer that Slurm killed
    first would be blamed for the rank that crashed.
    """
    own = [(last_of(e, TrialResult), code is not None, code) for e, code in zip(events, exits, strict=True)]
    if not srun_ended or first_failure(own)[1] is not None:
        return own
    return [(verdict, True, code if code is not None else -9) for verdict, _, code in own]
