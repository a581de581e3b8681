"""``isoprobe plot`` draws every trial, whatever its outcome (issue 58 item 2).

The plot kept its own list of failure styles, keyed by strings, and ``still_rising`` was not on it: such trials
were counted as failed and never drawn. The styles now come from ``report.outcomes.MEANINGS``. The legend is read
off the figure the plot saved (its labels name each failure class with its batches), so these tests do not depend
on how the styles are declared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from matplotlib.figure import Figure  # noqa: E402

from isoprobe.report.outcomes import Outcome  # noqa: E402
from isoprobe.report.plot import render  # noqa: E402
from isoprobe.report.result import Result  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "result-small-cnn.json"


def _legend_of(result: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The legend's labels of the figure ``render`` saves."""
    saved: list[Figure] = []
    real_savefig = Figure.savefig

    def savefig(self: Figure, *args, **kwargs):
        saved.append(self)
        return real_savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    render(Result.model_validate(result).model_dump(mode="json"), tmp_path / "probe.png")
    assert (tmp_path / "probe.png").read_bytes()[:4] == b"\x89PNG"
    (figure,) = saved
    return [text.get_text() for legend in figure.legends for text in legend.get_texts()]


def _with_outcome(outcome: Outcome) -> dict:
    """The fixture, its first failing trial (batch 138) ended as ``outcome``."""
    result = json.loads(FIXTURE.read_text())
    trial = next(t for t in result["trials"] if t["batch_size"] == 138)
    trial["outcome"] = outcome.value
    return result


def test_still_rising_trials_are_drawn(tmp_path, monkeypatch):
    labels = _legend_of(_with_outcome(Outcome.STILL_RISING), tmp_path, monkeypatch)
    rising = [label for label in labels if "still rising" in label]
    assert rising, f"no legend entry for the still_rising trial: {labels}"
    assert rising[0].endswith(": 138"), rising


@pytest.mark.parametrize("outcome", [o for o in Outcome if not o.meaning.fits])
def test_every_failure_class_is_drawn(outcome, tmp_path, monkeypatch):
    labels = _legend_of(_with_outcome(outcome), tmp_path, monkeypatch)
    assert any(label.startswith(outcome.meaning.plot.label) and "138" in label for label in labels), labels
