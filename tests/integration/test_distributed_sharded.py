"""ZeRO-1's and FSDP2's edges for real, in gangs of two gloo ranks on the CPU backend: each maximum survives a
long plain training loop in fresh processes and one sample more does not (tests/support/distributed_edges.py).

One process and DDP, and the strategies' ordering: test_distributed.py. The two modules are two units of the
suite's scheduler (tests/conftest.py, ONE_WORKER), so that its two workers run them at once.
"""

from __future__ import annotations

import pytest

from distributed_edges import check_long_run, probes_for_the_long_run


HERE = ("zero1", "fsdp")


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """One probe per strategy, as isoprobe runs it by default (the maximum run until steady), made once."""
    return probes_for_the_long_run(tmp_path_factory.mktemp("sharded"), HERE)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", HERE)
def test_each_strategys_maximum_survives_a_long_plain_run_and_the_next_batch_does_not(probes, strategy):
    """distributed_edges.check_long_run: 30 steps of a plain loop at the maximum survive, one sample more does not."""
    found, checked = probes
    check_long_run(strategy, found[strategy], checked[strategy])
