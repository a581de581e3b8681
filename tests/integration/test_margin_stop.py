"""A deciding trial stops in the child once its peak reaches the margin (issue 35: ``SteadyRule.stop_at_bytes``).

The rule is applied by the real child's step hook (``child.core.step_report``), so this runs real children: with a
spread wider than the whole budget's headroom, the deciding trial's peak is past the margin from its first steps
and the child must stop at search.steps; with the rule off (search.edge_spread 0) the same trial steps until its
peak holds still (at least the window and one: a quiet heap's window where its heap churns at most a MiB a step). A child that ignored ``stop_at_bytes`` fails the first probe.
"""

from __future__ import annotations

import json

from conftest import MODELS, run_cli


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
    rule = steady["steady_rule"]
    assert rule["stop_at_bytes"] is None
    # The window and one: a quiet heap's (3) where the trial's heap churned at most a MiB a step, else 5.
    quiet = steady["heap_churn_bytes"] is not None and steady["heap_churn_bytes"] <= rule["quiet_churn_bytes"]
    window = rule["quiet_window"] if quiet else rule["window"]
    assert steady["outcome"] == "fits" and len(steady["step_seconds"]) >= window + 1, (window, steady["step_seconds"])
    assert len(steady["step_seconds"]) > len(first["step_seconds"])  # it stepped on where the other stopped
