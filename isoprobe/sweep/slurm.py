"""The Slurm executor: the sweep's probes as one job array per GPU type, submitted through submitit.

submitit (``AutoExecutor`` + ``map_array``) writes the sbatch script, submits
the array, pickles ``task.run_item`` and its items into the sweep's folder and
runs them on the nodes. What comes back is read as JSON: each task writes its
row to the sweep's folder and its answer to the shared cache; submitit's
pickled results and its job states are not relied on (without Slurm
accounting it cannot tell a job's state at all). ``squeue`` says what is still
queued or running: a task that left the queue without writing its row failed,
and its row says how (the last line of its stderr: a time limit, a crash).

Before anything is submitted, each row is looked up (``records``): a sweep run
again submits nothing. Ctrl-C or SIGTERM cancels every array this sweep
submitted (``scancel``, then ``scancel --signal=KILL`` for tasks that linger:
submitit's task runner survives SIGTERM, expecting preemption) and returns only
once ``squeue`` lists none of them.

``Submitter`` is the seam: ``SubmititSubmitter`` talks to Slurm; the unit tests
pass a scripted one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from isoprobe.sweep.model import SweepItem, SweepRow, failed_row, row_from_result
from isoprobe.sweep.task import row_path
from isoprobe.system.primitives import ask_slurm

#: How often the rows and squeue are looked at.
POLL_SECONDS = 0.5
#: A task gone from squeue gets this long for its row to appear (a shared filesystem's attribute cache).
ROW_GRACE_SECONDS = 5.0
#: Cancelled tasks still listed after this long are sent SIGKILL.
KILL_AFTER_SECONDS = 5.0
CANCEL_TIMEOUT_SECONDS = 120.0

#: How long the sweep's own squeue and scancel may take: nothing but the sweep waits on them, and it polls again.
SWEEP_CLIENT_SECONDS = 30.0


@dataclass
class SlurmOptions:
    """How the arrays are submitted (from ``isoprobe sweep``'s flags)."""

    folder: Path  #: the sweep's own folder: submitit's files and the rows (private, on a shared filesystem)
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    time_minutes: int = 60
    array_parallelism: int = 16
    sbatch: dict[str, str] = field(default_factory=dict)  #: extra sbatch options, --KEY=VALUE


class Submitter(Protocol):
    def submit(self, target: str, items: list[SweepItem]) -> tuple[str, list[str]]:
        """Submit one array for ``target``: (its array id, one task id per item, in order)."""

    def active(self) -> set[str] | None:
        """Task ids (ARRAY_TASK) still queued or running, or None when squeue could not be asked."""

    def cancel(self, array_ids: list[str], kill: bool = False) -> None:
        """scancel the arrays (``kill``: SIGKILL to whatever still runs)."""

    def why_failed(self, task_id: str) -> str:
        """For a task that ended without a row: the last line of its stderr."""


def run_slurm(
    items: list[SweepItem], options: SlurmOptions, say: Callable[[str], None], submitter: Submitter | None = None
):
    """(rows in order, submitted count, array ids, None or 'interrupted'/'terminated')."""
    from isoprobe.errors import SpecError, Terminated

    rows: dict[int, SweepRow] = {}
    pending: dict[str, list[SweepItem]] = {}
    for item in items:
        try:
            spec = item.load()
        except SpecError as error:  # found on the login node: nothing to submit for it
            rows[item.index] = failed_row(item.shown, item.target, f"bad spec: {error.render()}")
            continue
        if not item.refresh:
            from isoprobe.sweep.records import recorded_result

            result, why = recorded_result(item, spec)
            if why:
                say(f"isoprobe: {item.shown} on {item.target}: {why}; probing")
            if result is not None:
                rows[item.index] = row_from_result(item.shown, item.target, result)
                continue
        pending.setdefault(item.target, []).append(item)
    arrays: list[str] = []
    submitted = sum(len(group) for group in pending.values())
    if not submitted:
        return [rows[item.index] for item in items], 0, arrays, None
    submitter = submitter or SubmititSubmitter(options)
    task_of: dict[int, str] = {}
    try:
        for target, group in list(pending.items()):
            try:
                array_id, task_ids = submitter.submit(target, group)
            except (
                Exception
            ) as exc:  # sbatch refused (a partition that does not exist, an account): this GPU type's rows
                del pending[target]
                reason = " ".join(str(exc).split())[:500] or type(exc).__name__
                say(f"isoprobe: submitting {len(group)} probes on {target} failed: {reason}")
                for item in group:
                    rows[item.index] = failed_row(item.shown, item.target, f"the job array was not submitted: {reason}")
                continue
            arrays.append(array_id)
            task_of.update({item.index: task for item, task in zip(group, task_ids, strict=True)})
            say(f"isoprobe: submitted job array {array_id} ({len(group)} probes on {target})")
        _collect([item for group in pending.values() for item in group], task_of, options, submitter, rows)
        stopped = None
    except (KeyboardInterrupt, Terminated) as signal:
        stopped = "interrupted" if isinstance(signal, KeyboardInterrupt) else "terminated"
        say(f"isoprobe: {stopped}: cancelling job arrays {', '.join(arrays) or '(none yet)'}")
        _cancel(submitter, arrays, say)
        _read_rows([i for g in pending.values() for i in g if i.index not in rows], options, task_of, rows)
        for group in pending.values():
            for item in group:
                rows.setdefault(
                    item.index,
                    failed_row(item.shown, item.target, f"cancelled: the sweep was {stopped}", task_of.get(item.index)),
                )
    return [rows[item.index] for item in items], submitted, arrays, stopped


def _read_rows(items: list[SweepItem], options: SlurmOptions, task_of: dict[int, str], rows: dict[int, SweepRow]):
    for item in items:
        path = row_path(Path(item.rows_dir or options.folder / "rows"), item.index)
        try:
            rows[item.index] = SweepRow.model_validate_json(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            rows[item.index] = failed_row(
                item.shown, item.target, f"its row {path} is unreadable: {exc}", task_of.get(item.index)
            )


def _collect(items, task_of, options, submitter: Submitter, rows: dict[int, SweepRow]) -> None:
    """Wait for every row: written by its task, or failed because the task left the queue without one."""
    gone_since: dict[int, float] = {}
    while True:
        waiting = [item for item in items if item.index not in rows]
        _read_rows(waiting, options, task_of, rows)
        waiting = [item for item in waiting if item.index not in rows]
        if not waiting:
            return
        active = submitter.active()
        now = time.monotonic()
        for item in waiting:
            task = task_of[item.index]
            if active is None or task in active:
                gone_since.pop(item.index, None)
                continue
            if now - gone_since.setdefault(item.index, now) >= ROW_GRACE_SECONDS:
                rows[item.index] = failed_row(
                    item.shown,
                    item.target,
                    f"the Slurm task {task} ended without an answer: {submitter.why_failed(task)}",
                    task,
                )
        time.sleep(POLL_SECONDS)


def _cancel(submitter: Submitter, arrays: list[str], say: Callable[[str], None]) -> None:
    """Cancel the arrays and wait until squeue lists none of their tasks (SIGKILL for those that linger)."""
    if not arrays:
        return
    submitter.cancel(arrays)
    began, killed = time.monotonic(), False
    while time.monotonic() - began < CANCEL_TIMEOUT_SECONDS:
        active = submitter.active()
        ours = None if active is None else {t for t in active if t.split("_")[0] in arrays}
        if ours is not None and not ours:
            return
        if not killed and time.monotonic() - began >= KILL_AFTER_SECONDS:
            submitter.cancel(arrays, kill=True)
            killed = True
        time.sleep(0.2)
    say(
        f"isoprobe: job arrays {', '.join(arrays)} still listed by squeue after {CANCEL_TIMEOUT_SECONDS:.0f} s; "
        f"check with squeue --me"
    )


class SubmititSubmitter:
    """The real thing: submitit's Slurm executor for submitting, squeue and scancel for the rest."""

    def __init__(self, options: SlurmOptions):
        self.options = options
        self.jobs: dict[str, Any] = {}  # submitit's jobs by task id (submitit has no types)

    def submit(self, target: str, items: list[SweepItem]) -> tuple[str, list[str]]:
        import submitit

        from isoprobe.sweep.task import run_item

        executor = submitit.AutoExecutor(folder=self.options.folder / "submitit" / "%j", cluster="slurm")
        parameters: dict = {
            "name": "isoprobe-sweep",
            "timeout_min": self.options.time_minutes,
            "slurm_array_parallelism": self.options.array_parallelism,
        }
        kind, _, value = target.partition("=")
        parameters["slurm_partition" if kind == "partition" else "slurm_constraint"] = value
        if self.options.gpus_per_task:
            parameters["slurm_gpus_per_task"] = self.options.gpus_per_task
        if self.options.cpus_per_task:
            parameters["cpus_per_task"] = self.options.cpus_per_task
        if self.options.sbatch:
            parameters["slurm_additional_parameters"] = dict(self.options.sbatch)
        executor.update_parameters(**parameters)
        jobs = executor.map_array(run_item, items)
        for job in jobs:
            self.jobs[job.job_id] = job
        return jobs[0].job_id.split("_")[0], [job.job_id for job in jobs]

    def active(self) -> set[str] | None:
        done = ask_slurm(["squeue", "--me", "-h", "-r", "-o", "%i"], SWEEP_CLIENT_SECONDS)
        return set(done.stdout.split()) if done is not None and done.returncode == 0 else None

    def cancel(self, array_ids: list[str], kill: bool = False) -> None:
        command = ["scancel", *(["--signal=KILL", "--full"] if kill else []), *array_ids]
        ask_slurm(command, SWEEP_CLIENT_SECONDS)

    def why_failed(self, task_id: str) -> str:
        job = self.jobs.get(task_id)
        try:
            text = job.stderr() if job is not None else None
        except OSError:
            text = None
        lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
        return lines[-1][:500] if lines else "no output (see squeue/sacct for the job's state)"


#: What the Slurm executor runs: submitit submits with sbatch and insists on srun; squeue and scancel are ours.
SLURM_COMMANDS = ("sbatch", "srun", "squeue", "scancel")


def missing_commands() -> list[str]:
    """Slurm's client commands not on PATH: without them ``--executor slurm`` cannot submit, watch or cancel."""
    import shutil

    return [command for command in SLURM_COMMANDS if shutil.which(command) is None]


def private_folder(path: Path) -> Path:
    """The sweep's folder, made private (0700): submitit unpickles what is in it, so nobody else may write there."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path
