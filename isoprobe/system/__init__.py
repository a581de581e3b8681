"""The operating system's primitives, without torch: used by the parent and by a trial's process alike.

keeper.py    a process that outlives nothing: it kills every descendant of a trial, whatever its session
pid1.py      running as PID 1 (a container's entrypoint): a tiny init in front of isoprobe
oomkill.py   the kernel's record of OOM kills, to tell an OOM-killer SIGKILL from any other
primitives.py  a process's state, its scheduler autogroup, and the end of the Slurm job steps an srun started
standalone.py  the one loader of the standard-library-only code that runs without isoprobe's package (its list)
slurm_job.py  whether a SIGTERM is the Slurm job's time limit (scontrol, once), and the message that says so
files.py     files in a folder others can write (the cache), opened without trusting what lies there
stops.py     SIGINT and SIGTERM for a command that prints what it did so far: the first stops the work
data_cap.py  the CPU cap (RLIMIT_DATA): its limits, set before exec, in a fork, on a Slurm rank, credited
proc_memory.py  a process's memory as /proc tells it (status fields, writable shared mappings); the shim loads it
hardware.py  what this machine has (GPUs, CPU, RAM), learned without a CUDA context
cpu_share.py  the CPU a process tree got while it wanted it (schedstat): a busy node told from a hung trial
"""
