"""A command trial: the job's own command at one batch, supervised from a process that never imports torch.

    supervisor.py  the trial: start the command, read its steps, judge each, end it and everything it started
    start.py     how a command is started, cold or ahead: its environment, its cap, its session
    warm.py      a command started ahead of its trial: start it while waiting, hand it the batch, or end it
    tree.py      what the command's processes reported through the shim, and who is a rank
    verdicts.py  how a command trial ended: its ranks' exceptions, a lost rank, forged lines, over the budget
    seen.py      what the supervisor has seen so far, written as it goes (what a timeout reports)
    trained_batch.py  whether a command's steps trained at the batch asked (the model's forward shapes)
    rank_loss.py     which rank a launcher lost to a signal, from its report and the peers' errors

The shim that runs inside the command's own processes stays at ``child/shim/``: it is put on the command's
``PYTHONPATH`` as a folder and loads ``child/cuda_readings.py`` and ``child/native_reads.py`` by their paths.
"""
