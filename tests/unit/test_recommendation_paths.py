"""The recommendation is a function of the measurements, not of the path that took them (issue 34).

Two identical ``probe()`` calls once recommended 12 and 1 for the same maximum (12): whether the estimate
finished in its time changed which batches the search measured, the line through them, and with it the
capacity the headroom was measured from. A scripted device with a cliff (its measured peaks stay far below
the cap, then batch 13 fails on one large allocation) and a little noise in its peaks, probed along
different paths.
"""

from __future__ import annotations

import pytest

from isoprobe.executors.scripted import Call, ScriptedExecutor, fits, out_of_memory

from scripted_probe import MiB, hog_spec, probe

#: Peaks of batch 1..12 in MiB: about 600 + 6 a sample, with the noise of real readings; 13 and up run out.
PEAKS = {b: 600 + 6 * b + noise for b, noise in zip(range(1, 13), (0, 4, -3, 2, 0, -4, 3, 1, -2, 5, -1, 0))}


def cliff(call: Call):
    peak = PEAKS.get(call.batch_size)
    if peak is None:
        return out_of_memory(at_step=1)
    steps = 7 if call.request.steady is not None else 2
    return fits(peak * MiB, base_bytes=560 * MiB, step_peaks=[peak * MiB] * steps)


@pytest.mark.parametrize("start", [2, 5, 9, 11, 12])
def test_every_path_to_the_same_maximum_gives_the_same_recommendation(start):
    spec = hog_spec(start_batch_size=start, estimate=False)
    spec["recommendation"] = {"soak_steps": 0, "headroom": 0.1}
    result = probe(spec, ScriptedExecutor(cliff)).result
    assert (result.max_batch_size, result.first_failing_batch_size) == (12, 13)
    # 12 peaked at 672 MiB, far inside 1.5 GiB less 10 %: proven to keep the headroom, so it is recommended.
    assert result.recommended_batch_size == 12, result.recommendation.note
    assert result.recommendation.capacity_bytes == 1536 * MiB
    assert result.recommendation.measured_peak_bytes == PEAKS[12] * MiB
