"""``isoprobe frontier`` keeps what it answered: without the cache, with a value that breaks the model, under signals.

Issue 34: ``frontier --no-cache`` answered every point and died in its table
(exit 1, nothing on stdout); a factory that raises for one value ended the whole
frontier; SIGINT or SIGTERM gave exit 1 and no point. The scripted versions are
``tests/unit/test_frontier_points.py``; these run the real command, since only
a real process shows what reaches stdout and the exit code. Cheap: the tiny
faulty model (tests/support/faults.py), a search from 2, one short trial a batch.
"""

from __future__ import annotations

import json
import signal

import pytest

from conftest import FAULTS, run_cli
from signalled import signalled_after_first_trial


#: The faulty model's edge is its ``edge`` kwarg; nothing above 4 is tried.
SEARCH = {"start_batch_size": 2, "max_batch_size": 4, "steps": 2, "trial_timeout": 120, "estimate": False,
          "confirmations": 0, "steady_steps": 0}


def spec(factory: str, kwargs: dict) -> dict:
    return {"model": {"factory": factory, "kwargs": kwargs}, "input": {"shape": [16]}, "target": {"classes": 4},
            "optimizer": {"name": "sgd"}, "search": SEARCH, "device": "cpu", "memory_budget": "2GiB",
            "recommendation": {"soak_steps": 0, "headroom": 0}}


def test_without_the_cache_a_value_that_breaks_the_model_is_its_points_error(write_spec, tmp_path):
    """Two of the class in one frontier: --no-cache (every point without a cache entry: the table crashed on it),
    and a factory that raises at edge=4 (its environment check fails: that ended the frontier, exit 2, no
    document). Now edge=4 is that point's error, edge=3 is answered, the document is printed and exit is 4."""
    (tmp_path / "picky.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(FAULTS.parent)!r})\n"
        "from faults import faulty\n\n"
        "def picky(edge):\n"
        "    if edge == 4:\n"
        "        raise RuntimeError('no model at edge 4')\n"
        "    return faulty('raise', at=100, edge=edge)\n")
    path = write_spec(spec("picky.py:picky", {"edge": 3}))
    run = run_cli("frontier", str(path), "--no-cache", "--over", "model.kwargs.edge=3,4")
    assert run.returncode == 4, run.stderr
    assert "Traceback" not in run.stderr
    document = run.json
    assert document["schema_version"] == 2 and document["interrupted"] is None and not document["answered"]
    three, four = document["points"]
    assert (three["value"], three["max_batch_size"], three["error"]) == (3, 3, None)
    assert three["result"]["cache"] is None
    assert four["result"] is None and "no model at edge 4" in four["error"]
    assert "model.kwargs.edge=4: no answer: bad spec at this value" in run.stderr


@pytest.mark.parametrize(("signum", "count", "cache"), [
    (signal.SIGINT, 1, False),   # the first example, without the cache
    (signal.SIGTERM, 2, True),   # with the cache, and a second signal 0.2 s after the first
])
def test_a_signal_during_a_frontier_prints_the_points_so_far(write_spec, signum, count, cache):
    """Batch 2 fits, every larger batch hangs: the signal lands in the first point's second trial. Exit 130/143
    (was 1), and the document: that point with its finished trial, the other point not probed."""
    path = write_spec(spec(f"{FAULTS}:faulty", {"fault": "hang", "at": 3, "edge": 5}))
    args = ["frontier", str(path), "--over", "model.kwargs.edge=5,6"] + ([] if cache else ["--no-cache"])
    code, stdout, stderr = signalled_after_first_trial(args, [signum] * count, 0.2)
    reason = "interrupted" if signum == signal.SIGINT else "terminated"
    assert code == (130 if signum == signal.SIGINT else 143), stderr
    assert "Traceback" not in stderr
    document = json.loads(stdout)
    assert document["interrupted"] == reason and not document["answered"]
    five, six = document["points"]
    assert six["probed"] == 1 and six["result"]["stop_reason"] == reason
    assert [(t["batch_size"], t["outcome"]) for t in six["result"]["trials"]] == [(2, "fits")]
    assert five["probed"] is None and five["result"] is None and five["error"] == f"not probed: the frontier was {reason}"
    assert f"{reason}: 1 of 2 points probed" in stderr
