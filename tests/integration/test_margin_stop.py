"""A deciding trial stops in the child once its peak reaches the margin (issue 35: ``SteadyRule.stop_at_bytes``).

The rule is applied by the real child's step hook (``child.step_report``), so this runs real children: with a
spread wider than the whole budget's headroom, the deciding trial's peak is past the margin from its first steps
and the child must stop at search.steps; with the rule off (search.edge_spread 0) the same trial steps until its
peak holds still (at least the window and one). A child that ignored ``stop_at_bytes`` fails the first probe.
"""

from __future__ import annotations

import json

import pytest

from conftest import MODELS, run_cli

pytestmark = pytest.mark.integration


def _spec(edge_spread: str) -> dict:
    return {
        "model": {"factory": f"{MODELS}:big_linear", "kwargs": {"features": 256}},
        "input": {"shape": [256]},
        "target": {"classes": 256},
        "optimizer": {"name": "sgd"},
        # The cap is the first trial: it would be the maximum if it fit, so it steps until steady (it decides).
        "search": {"start_batch_size": 4, "max_batch_size": 4, "steps": 2, "estimate": False,
                   "edge_spread": edge_spread, "trial_timeout": 120},
        "device": "cpu",
        "memory_budget": "2GiB",
        "recommendation": {"soak_steps": 0},
    }


def test_a_deciding_trial_past_the_margin_stops_at_its_minimum_steps(write_spec):
    wide = json.loads(run_cli("run", str(write_spec(_spec("1900MiB"), "wide.yaml")), "--format", "json").stdout)
    first = wide["trials"][0]
    assert first["batch_size"] == 4 and first["outcome"] == "fits"
    assert first["steady_rule"]["stop_at_bytes"] is not None
    assert len(first["step_seconds"]) == 2, first["step_seconds"]  # stopped at the margin, in the child
    # Every batch down to 1 fits inside so wide a spread: said as such, not as growth over steps.
    assert [m["batch_size"] for m in wide["edge_margin"]["marginal"]] == [1, 4]
    assert "no batch leaves more than the spread free" in wide["message"]
    off = json.loads(run_cli("run", str(write_spec(_spec("0"), "off.yaml")), "--format", "json").stdout)
    steady = off["trials"][0]
    assert steady["steady_rule"]["stop_at_bytes"] is None
    assert steady["outcome"] == "fits" and len(steady["step_seconds"]) >= 6  # the window (5) and one
