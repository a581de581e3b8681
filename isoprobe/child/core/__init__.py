"""The core trial: isoprobe's own training loop at one batch size, and what it reads.

    trial.py     a trial: the training steps at one batch size, and their peak memory
    step_report.py  after each step: its event, its memory, whether to stop (the steady rule)
    workload.py  *what* is trained: the model from its source, the synthetic batch, the loss
    training.py  *how* a step runs: the spec's training options, applied and read back
    data.py      the batch from the user's dataset (spec.data): lengths, worst-first order, collated batch
    references.py  resolving 'module:function' and 'file.py:function' to the user's callable
    cuda.py      CUDA in a child: initialisation, the libraries' warm-up, the budget's cap, the squeeze
    distributed.py  a rank of a gang trial: join the gang, wrap model and optimizer as the real job does
    optimizer_state.py  fp16 mixed precision: the optimizer really stepped, so its state is in the peak
    memory.py    the child's own memory from /proc/self: a CPU trial's peaks, in the budget's units
    heap_churn.py   glibc's heap churn after a step (malloc_info)
    estimate.py  the memory estimate before any trial: this loop's step traced without real memory

The framework runners (``child.framework``) and the environment check use its step report, its workload and its
readings; a command trial (``child.command_trial``) uses none of it but the memory readings.
"""
