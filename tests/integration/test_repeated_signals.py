"""Several SIGINTs or SIGTERMs at ``isoprobe run`` after a trial finished: the trials so far are printed, whole.

Issue 34: two SIGTERMs 0.2 s apart after trial 1 gave exit 143, "terminated
before the first trial" and no JSON (5 ms apart it worked). The second signal
was raised inside the first one's cleanup: the running trial being stopped,
the executor closed, or the document written to a pipe nobody read yet (where,
under ``PYTHONUNBUFFERED=1``, the interrupted write also dropped the rest of the
document). Only a real process shows where a signal lands, so these run the
real command; stdout is read only after the last signal, as a slow reader
would, and ``PYTHONUNBUFFERED=1`` is set as containers set it. Measured before
the fix with 2 and 3 signals at 5 ms, 200 ms and 1 s, SIGINT and SIGTERM: 10 of
12 lost the document; after: 12 of 12 kept it.
"""

from __future__ import annotations

import json
import signal

import pytest

from conftest import faulty_spec
from signalled import signalled_after_first_trial


@pytest.mark.parametrize(("signum", "count", "spacing"), [
    (signal.SIGTERM, 2, 0.2),   # the case
    (signal.SIGINT, 3, 1.0),    # more of them, the last ones while the document waits for its reader
])
def test_repeated_signals_keep_the_finished_trial(write_spec, signum, count, spacing):
    """Batch 2 fits; every larger batch hangs until killed: the signals always come after trial 1, mid-trial 2."""
    path = write_spec(faulty_spec("hang", at=3, trial_timeout=300))
    code, stdout, stderr = signalled_after_first_trial(["run", str(path)], [signum] * count, spacing)
    reason = "interrupted" if signum == signal.SIGINT else "terminated"
    assert code == (130 if signum == signal.SIGINT else 143), stderr
    assert "before the first trial" not in stderr
    result = json.loads(stdout)
    assert result["stop_reason"] == reason
    assert [(t["batch_size"], t["outcome"]) for t in result["trials"]] == [(2, "fits")]


def test_a_sweep_keeps_its_rows_under_repeated_signals(write_spec, tmp_path):
    """Another of the class: 'isoprobe sweep' raised every SIGTERM too, so a later one cut the first one's cleanup
    short (with Slurm: the cancelling of its arrays). Three SIGTERMs 50 ms apart mid-row 1 of 2: row 1 lost its
    finished trial ('terminated before its first trial'; measured 2 of 2 runs, and at 5 ms). Now exit 143, row 1
    terminated after its finished trial, row 2 not probed."""
    path = write_spec(faulty_spec("hang", at=3, trial_timeout=300))
    other = write_spec(faulty_spec("hang", at=3, trial_timeout=300), name="other.yaml")
    code, stdout, stderr = signalled_after_first_trial(["sweep", str(path), str(other), "--format", "json"],
                                                       [signal.SIGTERM] * 3, 0.05)
    assert code == 143, stderr
    report = json.loads(stdout)
    assert report["interrupted"] == "terminated"
    first, second = report["rows"]
    assert (first["stop_reason"], first["trials"]) == ("terminated", 1)
    assert second["error"] == "not probed: the sweep was terminated"
