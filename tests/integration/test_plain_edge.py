"""Issue 25, class 6: on the CPU backend, isoprobe's maximum is the edge of a plain training process.

Checked against an independent harness (``benchmarks/plain_edge.py``): a
fresh ``python -c`` process per batch that imports only torch, builds the
spec's model and runs the spec's steps of the classic loop under the same cap
and malloc setting, with none of isoprobe's trial code in it. The maximum must
fit there and one more must not. Models with a few MiB a sample, where the
6.3 MiB isoprobe's own modules took in the trial process cost one or two
samples (measured before the fix: small-cnn 134 against a plain 136).
"""

from __future__ import annotations

import sys

import pytest

from conftest import REPO, run_cli
from isoprobe.spec_load import load_spec

sys.path.insert(0, str(REPO / "benchmarks"))
from plain_edge import fits  # noqa: E402

pytestmark = pytest.mark.integration

SPECS = [REPO / "specs" / "small-cnn.yaml",
         REPO / "benchmarks" / "edge_specs" / "gru-lm-small.yaml",
         REPO / "benchmarks" / "edge_specs" / "memory-hog.yaml"]
#: Each spec's trials forked from the fork server (the CPU default); small-cnn's also spawned, which
#: credit through the hard limit the parent leaves (``executors.processes.prepare_child``).
CASES = [(path, "null") for path in SPECS] + [(SPECS[0], "false")]


@pytest.mark.parametrize(("spec_path", "fork_server"), CASES,
                         ids=[f"{path.stem}-{'spawned' if fork == 'false' else 'forked'}" for path, fork in CASES])
def test_the_maximum_fits_in_a_plain_process_and_one_more_does_not(spec_path, fork_server):
    # No soak: it only vets the recommendation, and the maximum is what is compared here.
    run = run_cli("run", str(spec_path), "--set", "recommendation.soak_steps=0",
                  "--set", f"search.fork_server={fork_server}", timeout=900)
    assert run.returncode == 0, run.stderr
    maximum = run.json["max_batch_size"]
    spec = load_spec(spec_path)
    trials = [(t["batch_size"], t["outcome"], t["budget_peak_bytes"]) for t in run.json["trials"]]
    assert fits(spec, maximum, spec.memory_budget), (maximum, trials)
    assert not fits(spec, maximum + 1, spec.memory_budget), (maximum, trials)
