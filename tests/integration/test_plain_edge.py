"""Issue 25, class 6: on the CPU backend, isoprobe's maximum is the edge of a plain training process.

Checked against an independent harness (``benchmarks/harness/plain_edge.py``): a
fresh ``python -c`` process per batch that imports only torch, builds the
spec's model and runs the spec's steps of the classic loop under the same cap
and malloc setting, with none of isoprobe's trial code in it. isoprobe's trials
run the same steps (``search.steady_steps=0``: no confirmation until steady).
The lm-head case is also the check of ``training.output_lifetime``'s default
(through_backward: the classic loop's output lives through backward) for
tests/integration/test_real_loop.py. The maximum must
fit there, and one more must not, unless that batch's plain peak lies within
``PRECISION_BYTES`` of the cap, where either process fits or runs out by
chance. Models with a few MiB a sample, where the 6.3 MiB isoprobe's own modules took in the trial process cost one or two
samples (measured before the fix, one thread: small-cnn 150 against a plain
153, memory-hog 165 against 167, lm-head 115 against 118).

One OpenMP thread on both sides (``OMP_NUM_THREADS=1``, which a trial inherits
and the harness passes on): with two, the plain process's own edge moved by a
sample from run to run (small-cnn's 137 failed once and fitted three times;
gru-lm-small's 179 fitted 2 of 3), the threads' allocations interleaving
differently; with one, each edge here fitted 3 of 3 and the batch above failed
3 of 3.
"""

from __future__ import annotations

import sys

import pytest

from conftest import REPO, run_cli
from isoprobe.spec.load import load_spec

sys.path.insert(0, str(REPO / "benchmarks" / "harness"))
from plain_edge import fits, peak  # noqa: E402


SMALL_CNN = REPO / "specs" / "small-cnn.yaml"
MEMORY_HOG = REPO / "benchmarks" / "specs" / "edge" / "memory-hog.yaml"
LM_HEAD = REPO / "benchmarks" / "specs" / "edge" / "lm-head.yaml"
#: Trials forked from the fork server (the CPU default), or spawned (crediting through the hard limit the
#: parent leaves: ``executors.processes.prepare_child``).
CASES = [(MEMORY_HOG, "null"), (LM_HEAD, "null"), (SMALL_CNN, "null"), (SMALL_CNN, "false")]
#: How close to the cap a plain process's peak may come at the batch above isoprobe's maximum and that batch
#: still be allowed to fail in isoprobe's trial: the precision of the CPU backend's edge. Measured 2026-11-26
#: (small-cnn at batch 152, one thread, data peak less the credit): a plain process 1338.66 to 1338.96 MB over
#: 6 runs, isoprobe's trials 1338.67 to 1339.06 MB over 14 (spawned and forked, with and without bytecode
#: caches): each spreads by up to 0.4 MB run to run, so a batch whose plain peak lies within half a MiB of the
#: cap fits or runs out by chance, in a plain process as in a trial. small-cnn's 153 is such a batch here
#: (0.12 to 0.45 MiB under the cap): CI once found 152 because its trial at 153 fitted, then ran out.
PRECISION_BYTES = 512 * 1024


def assert_fits_in_a_plain_process(fits_at, maximum: int, own_peak: int, budget: int, context) -> None:
    """A maximum isoprobe reports fits in a plain process (``fits_at(batch)``), unless isoprobe's own trial of it
    peaked within ``PRECISION_BYTES`` of the cap: there either process fits or runs out by chance, and then the
    batch below must fit. test_eval_batch.py holds the evaluation maximum to the same rule."""
    if not fits_at(maximum):
        assert budget - own_peak < PRECISION_BYTES, context
        assert fits_at(maximum - 1), context


@pytest.mark.parametrize(("spec_path", "fork_server"), CASES,
                         ids=[f"{path.stem}-{'spawned' if fork == 'false' else 'forked'}" for path, fork in CASES])
def test_the_maximum_fits_in_a_plain_process_and_one_more_does_not(spec_path, fork_server, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # isoprobe's trials and the harness's processes both inherit it
    # No soak: it only vets the recommendation, and the maximum is what is compared here. No steady-state
    # confirmation either: the harness runs the spec's 2 steps, so isoprobe's trials run those 2 steps too (its
    # one 2-step confirmation of the maximum stays); a maximum confirmed over 6 to 30 steps is another edge,
    # which benchmarks/harness/steady_harness.py checks against a 30-step plain loop (test_distributed.py, `none` included).
    run = run_cli("run", str(spec_path), "--set", "recommendation.soak_steps=0", "--set", "search.steady_steps=0",
                  "--set", f"search.fork_server={fork_server}", timeout=900)
    assert run.returncode == 0, run.stderr
    maximum = run.json["max_batch_size"]
    spec = load_spec(spec_path)
    trials = [(t["batch_size"], t["outcome"], t["budget_peak_bytes"]) for t in run.json["trials"]]
    # Never above the truth, with the same band of chance as the batch above (CI: small-cnn's 153 fitted in its
    # trial 28 KiB under the cap and ran out in the plain process).
    own = max(p for b, o, p in trials if b == maximum and o == "fits")
    assert_fits_in_a_plain_process(lambda batch: fits(spec, batch, spec.memory_budget), maximum, own,
                                   spec.memory_budget, (maximum, trials))
    above = peak(spec, maximum + 1, spec.memory_budget)  # None: one more runs out in a plain process too
    assert above is None or spec.memory_budget - above < PRECISION_BYTES, (maximum, above, trials)
