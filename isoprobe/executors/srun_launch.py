"""Starting a trial's Slurm job step: srun under a keeper, with the environment, limits and entry its ranks need.

Split from ``executors.srun_gang``, which decides when a step starts (on demand, or ahead of its trial) and
supervises and ends it; this is how one is started: the ``srun`` command (``srun_plan.srun_command``) run by a
keeper (``system.keeper``) that holds its lifeline and, if isoprobe dies, runs the commands in the step's
``ON_STOP_FILE`` (its ``scancel``, written by ``srun_gang`` once the step's id is known) before it kills srun.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from isoprobe.errors import ProbeError
from isoprobe.executors import Conditions
from isoprobe.executors.processes import child_environment, prepare_child, signals_deferred
from isoprobe.executors.srun_plan import srun_command
from isoprobe.executors.srun_step import _Step
from isoprobe.protocol.messages import PRELOAD_ENV
from isoprobe.system import keeper, standalone
from isoprobe.system.data_cap import data_limits

#: The commands srun's keeper runs if isoprobe dies mid-step (``keeper.run_on_stop``): ``scancel`` of the step.
ON_STOP_FILE = "on-stop.json"
#: The loader every rank of a step runs, isolated, for ``child.srun_rank`` (``srun_plan.RANK_MODULE``): it caps the
#: rank and gives it its files and GPU.
RANK_ENTRY = str(Path(standalone.__file__).resolve())


def start_step(
    folder: Path, world: int, conditions: Conditions, cuda: bool, *, nodes: int | None, srun: str, ahead: bool = False
) -> _Step:
    """Start ``world`` ranks as one step on ``nodes`` nodes, their files in ``folder``; ``ahead``: they import,
    then wait for their turn on srun's stdin (``_Step.turn``). ``ProbeError`` where there is no ``srun``."""
    env = child_environment(
        os.environ,
        backend=conditions.backend,
        allocator=conditions.allocator,
        events_path=folder / "unused.events",
        threads=conditions.threads,
    )
    if conditions.preload:
        env[PRELOAD_ENV] = ",".join(conditions.preload)
    # This node's hard limit is not the ranks' (each rank's wrapper lowers the hard limit to its own).
    limits = None if conditions.memory_limit is None else data_limits(conditions.memory_limit, resource.RLIM_INFINITY)
    argv = srun_command(
        world_size=world,
        nodes=nodes,
        step_dir=str(folder),
        python=sys.executable,
        rank_entry=RANK_ENTRY,
        data_limits=limits,
        cuda=cuda,
        ahead=ahead,
    )
    argv[0] = shutil.which(srun) or ""  # the keeper execs it as it is: no PATH search there
    if not argv[0]:
        raise ProbeError(
            f"distributed.launcher srun: there is no {srun} on PATH here; run isoprobe where "
            "Slurm's clients are installed (the job's nodes), or set distributed.launcher: local"
        )
    lifeline_read, lifeline_write = os.pipe()
    with signals_deferred(), open(folder / "srun.stdout", "wb") as out, open(folder / "srun.stderr", "wb") as err:
        try:
            process = subprocess.Popen(
                keeper.command(lifeline_read, argv, on_stop=str(folder / ON_STOP_FILE)),
                stdin=subprocess.PIPE if ahead else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=folder,
                start_new_session=True,
                pass_fds=(lifeline_read,),
                preexec_fn=prepare_child(None, os.getpid()),
            )
        except BaseException:
            os.close(lifeline_write)
            raise
        finally:
            os.close(lifeline_read)
    return _Step(folder, world, process, lifeline_write, began=time.monotonic(), turn=process.stdin if ahead else None)
