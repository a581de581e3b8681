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
    trial.py     a trial: the training steps at one batch size, and their peak memory
    step_report.py  after each step: its event, its memory, whether to stop (the steady rule)
    frameworks.py   a framework's own loop as the trial: lightning_runner.py, hf_trainer_runner.py
    environment_check.py  the environment check once per probe: versions, devices, can the spec be set up
    workload.py  *what* is trained: the model from its source, the synthetic batch, the loss
    data.py      the batch from the user's dataset (spec.data): lengths, worst-first order, collated batch
    references.py  resolving 'module:function' and 'file.py:function' to the user's callable
    estimate.py  the memory estimate before any trial: one step traced without real memory
    cuda.py      CUDA in a child: initialisation, the libraries' warm-up, applying the budget
    cuda_readings.py  the CUDA readings in the budget's units: the trials', the step reports' and the shim's
                      (stdlib only)
    distributed.py  a rank of a gang trial: join the gang, wrap model and optimizer as the real job does
    optimizer_state.py  fp16 mixed precision: the optimizer really stepped, so its state is in the peak
    source_only.py  isoprobe's own modules compiled from source in every child (no stale bytecode)
    training.py  *how* a step runs: the spec's training options, applied and read back
    memory.py    the child's own memory from /proc/self: a CPU trial's peaks, in the budget's units
    own_modules.py  what isoprobe's own modules take in the trial's process, credited to the CPU cap
    heap_churn.py   glibc's heap churn after a step (malloc_info)
    sources.py   the user's modules it ran, and the installed ones its model imported (for the preload)
    reads.py     the files it read (an audit hook), for the cache
    native_reads.py  what that hook misses: a read's path through a symbolic link, native readers (stdlib only)
    command.py   a command trial: the job's own command at one batch, supervised (no torch here)
    command_start.py     how a command is started, cold or ahead: its environment, its cap, its session
    warm_command.py      a command started ahead of its trial: start it while waiting, hand it the batch, or end it
    command_tree.py      what the command's processes reported through the shim, and who is a rank
    command_verdicts.py  how a command trial ended: its ranks' exceptions, a lost rank, forged lines, ...
    command_seen.py      what the supervisor has seen so far, written as it goes (what a timeout reports)
    trained_batch.py     whether a command's steps trained at the batch asked (the model's forward shapes)
    rank_loss.py         which rank a launcher lost to a signal, from its report and the peers' errors
    shim/        inside the command's own processes: the step hooks, the forwards, the CUDA budget, the reads
                 (stdlib only)

Importing this package imports nothing: torch is imported inside the functions
that need it, after the ``started`` event (or during a warm child's wait).
"""
