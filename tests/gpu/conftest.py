"""The GPU tier's failures, printed the moment they happen.

Why: the tier runs inside one device call with a hard limit (benchmarks/gpu_check.py), and pytest prints its
tracebacks only at the end of the session. The first real run (docs/gpu.md) was cut at its limit after 7 of 23
tests with one failure whose reason never came back.
"""

from __future__ import annotations

import sys


def pytest_runtest_logreport(report):
    if report.failed:
        sys.stdout.write(f"\n--- {report.nodeid} failed ({report.when}):\n{report.longreprtext[-4000:]}\n---\n")
        sys.stdout.flush()
