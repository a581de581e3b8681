"""A maximum only after the trial has seen the script's cycle (issue 55, part 1): a command whose validation, every
K steps, needs more memory than its training steps is answered with the edge of the whole cycle, checked against
the script's own run past its first validation (the user's job as the hook leaves it: the same cap, only what
``--format env`` exports); a script with no evaluation says that its answer covers training steps only.

Before issue 55 the trials stopped after 3 to 18 steps and the first kind was answered far too high: on
tests/commands/validates_every_k.py under 1 GiB the script's own edge is 118 over 5 steps and 60 over 20
(benchmarks/harness/command_truth.py), and a probe that never reached step 13 answered from the first.
"""

from __future__ import annotations

import json
import sys

from conftest import run_cli
from test_command import (  # noqa: F401 (scratch: the fixture)
    COMMANDS,
    LONG_RUN,
    assert_the_failing_batch_runs_out,
    command_truth,
    exported_environment,
    left_behind,
    probe,
    scratch,
)


def test_a_validation_every_k_steps_is_seen_before_the_maximum_and_the_answer_trains_past_it(tmp_path, scratch):
    template = [sys.executable, str(COMMANDS / "validates_every_k.py"), "--batch-size", "{batch_size}",
                "--max-steps", "{max_steps}", "--eval-every", "12"]
    command = [LONG_RUN if word == "{max_steps}" else word for word in template]
    done = probe(scratch, command, "--memory-budget", "1GiB", "--set", "recommendation.soak_steps=0")
    assert done.returncode == 0, done.stderr[-3000:]
    result = done.json
    assert result["max_cycle"].startswith("evaluation seen at step 13"), result["max_cycle"]
    assert "at the maximum, evaluation seen at step 13" in result["message"]
    deciding = [t for t in result["trials"] if t["batch_size"] == result["max_batch_size"] and t["outcome"] == "fits"
                and t["cycle"] is not None and t["cycle"]["evaluation_step"] == 13]
    assert deciding and deciding[-1]["cycle"]["waited"], [t["cycle"] for t in result["trials"]]
    assert left_behind(str(scratch)) == []
    marginal = [m["batch_size"] for m in (result["edge_margin"] or {}).get("marginal", [])]
    failing = result["first_failing_batch_size"] or max(marginal)
    # The user's job at the answer, past two validations (steps 12 and 24), and at the first failing batch.
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(result))
    exported = exported_environment(run_cli("show", str(saved), "--format", "env").stdout)
    truth = tmp_path / "truth"
    truth.mkdir()
    cap = command_truth.parse_size("1GiB")
    trains = command_truth.run_once(template, result["max_batch_size"], 30, cap, 300, truth, exported=exported)
    assert trains.outcome == "survived", (result["max_batch_size"], trains.reason, trains.tail)
    assert_the_failing_batch_runs_out(template, failing, 30, cap, truth, exported)
    # Its first five steps fit far above (their own edge is about 118, a coin toss there): what a probe that
    # stopped before the validation would have answered.
    far = result["max_batch_size"] * 3 // 2
    short = command_truth.run_once(template, far, 5, cap, 300, truth, exported=exported)
    assert short.outcome == "survived", (far, short.reason, short.tail)


def test_a_script_without_evaluation_waits_once_to_the_bound_and_says_the_answer_covers_training_steps(scratch):
    command = [sys.executable, str(COMMANDS / "plain_loop.py"), "--batch-size", "{batch_size}", "--max-steps",
               LONG_RUN, "--num-workers", "0"]
    done = probe(scratch, command, "--memory-budget", "1GiB", "--set", "search.cycle_steps=9",
                 "--set", "search.max_batch_size=16")
    assert done.returncode == 0, done.stderr[-3000:]
    result = done.json
    waited = [t for t in result["trials"] if t["cycle"] is not None and t["cycle"]["waited"]]
    # The bound is 9 steps; a trial whose readings are not yet steady there steps on until they are (the steady
    # rule, ``supervisor._enough``: measured once at 11 on a loaded machine), and still waited to the bound.
    assert len(waited) == 1 and waited[0]["cycle"]["bound"] == "steps" and waited[0]["cycle"]["steps"] >= 9
    # The progress says later trials do not wait, naming the steps that trial ran (9, or more where it stepped on).
    assert f"no evaluation pass within {waited[0]['cycle']['steps']} steps" in done.stderr, done.stderr[-3000:]
    assert "covers training steps only" in result["max_cycle"] or "not waited for" in result["max_cycle"]
    assert left_behind(str(scratch)) == []
