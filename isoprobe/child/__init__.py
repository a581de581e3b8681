"""The trial's process: the only code in isoprobe that imports torch.

``python -m isoprobe.child`` reads one typed request (``protocol.TrialRequest``
or ``InspectRequest``) and answers with typed events (``protocol``), so that
the parent never imports torch and never guesses at what a child meant.

    main.py      the entry: lifeline, events channel, warm wait, dispatch, fast exit
    trial.py     a trial: the training steps at one batch size, and their peak memory
    inspect.py   the environment check once per probe: versions, devices, can the spec be set up
    workload.py  *what* is trained: the model from its source, the synthetic batch, the loss
    training.py  *how* a step runs: the spec's training options, applied and read back
    memory.py    the child's own memory from /proc/self/status

Importing this package imports nothing: torch is imported inside the functions
that need it, after the ``started`` event (or during a warm child's wait).
"""
