"""``isoprobe frontier``'s mistakes: refused with exit 2 before any trial, naming the field (and the schema).

Fast: the CLI runs in this process (``cli``); every case below stops at the
spec, before the environment check starts a child (``no_trial`` makes sure).
"""

from __future__ import annotations

import json

import pytest

import isoprobe.api
from conftest import REPO, cli

SPEC = REPO / "specs" / "gru-lm.yaml"  # input.shape [128]


@pytest.fixture
def no_trial(monkeypatch):
    """A probe must not start: every case here is refused before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a probe started for a frontier that should have been refused")

    monkeypatch.setattr(isoprobe.api, "answer_for", refuse)


@pytest.mark.parametrize("over, field, said", [
    ("input.shap.0=64,128", "input.shap", "unknown field"),
    ("input.shape.0=64,abc", "input.shape.0 (from --over input.shape.0='abc')", "integer"),
    ("input.shape.0=64,-1", "input.shape.0 (from --over input.shape.0=-1)", "greater than"),
    ("input.shape.0=", "input.shape.0 (from --over input.shape.0=)", "no value to probe at"),
    ("input.shape.0=64,,128", "input.shape.0 (from --over input.shape.0=64,,128)", "not valid YAML"),
    ("input.shape.0=64,64", "input.shape.0 (from --over input.shape.0=64,64)", "given twice"),
    ("input.shape.5=1,2", "input.shape.5", "not the index of one of its 1 element(s)"),
    ("training.precision=fp32,bf16-mixed --direction increasing", "training.precision (from --over)",
     "is not a number"),
    ("input.shape.0", "--over input.shape.0", "no '=' in it"),
])
def test_bad_over_exits_2_naming_the_field_before_any_trial(over, field, said, no_trial):
    text, _, flags = over.partition(" ")
    run = cli("frontier", str(SPEC), "--over", text, *flags.split())
    assert run.returncode == 2, run.stderr
    assert field in run.stderr and said in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""


def test_the_frontier_schema_is_published():
    printed = cli("schema", "--frontier")
    assert printed.returncode == 0
    assert printed.stdout == (REPO / "docs" / "frontier.schema.json").read_text(encoding="utf-8"), \
        "the schema changed: regenerate with `isoprobe schema --frontier > docs/frontier.schema.json`"
    assert "FrontierPoint" in json.loads(printed.stdout)["$defs"]


@pytest.mark.parametrize("command", ["frontier", "sweep"])
def test_a_second_over_is_refused_not_silently_put_in_place_of_the_first(command, no_trial):
    """Issue 34: 'frontier --over A=.. --over B=..' probed B alone and said nothing of A. A frontier (and a sweep's
    rows) vary one field: two --over are a usage error naming both, exit 2, before anything runs."""
    run = cli(command, str(SPEC), "--over", "input.shape.0=64,128", "--over", "training.precision=fp32,bf16-mixed")
    assert run.returncode == 2, run.stderr
    assert f"isoprobe {command}: --over is given 2 times" in run.stderr
    assert "input.shape.0=64,128" in run.stderr and "training.precision=fp32,bf16-mixed" in run.stderr
    assert "--set" in run.stderr and "Traceback" not in run.stderr and run.stdout == ""
