"""The trial's process: the only code in isoprobe that imports torch.

``python -m isoprobe.child`` reads one typed request (``protocol.TrialRequest``
or ``InspectRequest``) and answers with typed events (``protocol``), so that
the parent never imports torch and never guesses at what a child meant.

    main.py      the entry: lifeline, events channel, warm wait, dispatch, fast exit
    preload.py   what a waiting child imports ahead of its request, and more when told (stdlib only)
    events.py    the events channel: one event, one JSON line, one write
    request.py   running one request (trial or check) in this process, and leaving fast
    server.py    the fork server: one fork (under its keeper) per trial
    srun_rank.py a rank of a Slurm job step: its cap, files and GPU, then this entry (stdlib only)
    environment_check.py  the environment check once per probe: versions, devices, can the spec be set up
    cuda_readings.py  the CUDA readings in the budget's units: the trials', the step reports' and the shim's
                      (stdlib only, loaded by path in a command's processes)
    source_only.py  isoprobe's own modules compiled from source in every child (no stale bytecode)
    own_modules.py  what isoprobe's own modules take in the trial's process, credited to the CPU cap
    sources.py   the user's modules it ran, and the installed ones its model imported (for the preload)
    reads.py     the files it read (an audit hook), for the cache
    native_reads.py  what that hook misses: a read's path through a symbolic link, native readers (stdlib only)

By trial kind, one subpackage each:

    core/        the core trial: isoprobe's own training loop, its step report, workload, CUDA budget and readings,
                 and the estimate (its step traced on fake tensors)
    framework/   a framework's own loop as the trial: Lightning's fit, the Hugging Face Trainer's train
    command_trial/  the job's own command at one batch: its start (cold or ahead), tree, verdicts, trained batch,
                 rank loss, supervised from here (no torch)
    shim/        inside the command's own processes: the step hooks, the forwards, the CUDA budget, the reads
                 (stdlib only; a folder on the command's PYTHONPATH, so it stays here, beside what it loads by path)

Importing this package imports nothing: torch is imported inside the functions
that need it, after the ``started`` event (or during a warm child's wait).
"""
