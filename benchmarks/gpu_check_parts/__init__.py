"""benchmarks/gpu_check.py's parts:

- ``judge``: pure, what the check computes and judges (the edge against the yardstick, the readings, the time plan);
- ``page``: pure, docs/gpu.md rendered from a run's report;
- ``runner``: the one seam to processes (a run to its limit, the ballast held beside, the archive);
- ``ballast``: a standalone script that leaves only the budget free on a card (imports nothing of isoprobe);
- ``plain_loop``: the yardstick's training loop, a standalone script that imports nothing of isoprobe.
"""
