"""The names that wire a child process to its parent: its module, its arguments, its environment variables, and
the files a command trial's shim shares with its supervisor. The one module of the wire's constants.

Standard library only, in the standalone layer (``system.standalone``: a Slurm rank's wrapper and the shim load
it by its file), and apart from ``protocol``'s models, because the child reads them first thing, before it
imports torch: whatever it imports before torch cannot be measured apart from what torch would import anyway, and
only what is measured is credited to the CPU cap (``child.own_modules``; the cap itself: ``system.data_cap``).
"""

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
#: Environment variable every process of every trial gets (the probe's pid): a hook that runs in one (Slurm's
#: TaskProlog runs for every task of a trial's srun step, a job script's hook line in a command trial) does nothing.
TRIAL_ENV = "ISOPROBE_TRIAL"
#: Environment variable listing (comma-separated) the modules a warm child imports before its request.
PRELOAD_ENV = "ISOPROBE_PRELOAD"
#: A line a waiting child (``WAIT_ARGUMENT``) reads on stdin before its request's path: import the modules the
#: file after the prefix names (one a line) too, report ``warm`` again, and wait on. The parent never writes a
#: request path so (its paths are absolute). How a spare started before the environment check takes on the
#: model's imports (a file, not the names: a line of up to 1000 of them could fill the pipe).
IMPORT_LINE = "import "
#: Environment variable handing a waiting command trial's process its plan (``protocol.warm_command.WarmPlan`` as
#: JSON, from ``Conditions.command_plan``): start the command ahead while waiting. Removed before anything runs.
WARM_PLAN_ENV = "ISOPROBE_WARM_PLAN"

# ---------------------------------------------------------------------------- a command trial's shim

#: The variable naming a command trial's folder (``child/shim``): the shim's lines and the gate are there.
SHIM_DIR_ENV = "ISOPROBE_SHIM_DIR"
#: CUDA: the per-rank budget in bytes: what the process may hold of each card it uses, context included, as in
#: isoprobe's own trials.
SHIM_CUDA_BUDGET_ENV = "ISOPROBE_SHIM_CUDA_BUDGET"
#: CUDA: the memory outside the allocator expected before the command runs, in bytes, taken off the fraction from
#: CUDA's initialisation on.
SHIM_CUDA_OUTSIDE_ENV = "ISOPROBE_SHIM_CUDA_OUTSIDE"
#: The file in the trial's folder whose number says how many optimizer steps each process may finish.
GATE_FILE = "gate"
#: The variable naming the pipe a command's interpreter started ahead gets its trial on (``protocol.warm_command``):
#: only in that process, which removes it at once.
WARM_FD_ENV = "ISOPROBE_WARM_FD"
#: The file the interpreter started ahead writes in the trial's folder once it waits: ``READY since``.
WARM_READY_FILE = "warm-ready"
