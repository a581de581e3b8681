"""benchmarks/gpu_check.py's parts: ``judge`` (pure: what the check computes and judges, tested on fake
readings) and ``plain_loop`` (the independent truth, a standalone script that imports nothing of isoprobe)."""
