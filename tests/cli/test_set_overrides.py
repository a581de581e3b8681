"""``--set FIELD=VALUE``: any spec field from the command line, validated as the YAML is, named by its flag.

Fast: the CLI runs in this process (``cli``) and nothing here starts a trial (a
``run`` with a bad --set stops at the spec, before any child). The values go
through the spec file's YAML rules (``spec.yaml_file.parse_yaml``): the hostile ones
below are the file's hostile cases, one flag long.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO, cli
from isoprobe.errors import SpecError
from isoprobe.spec.load import load_spec

SPEC = REPO / "specs" / "small-cnn.yaml"  # search.max_batch_size unset, precision fp32, memory_budget 1.25GiB


def problems(*sets: str, overrides: dict | None = None) -> list:
    with pytest.raises(SpecError) as info:
        load_spec(SPEC, overrides, sets=sets)
    return info.value.problems


def field_of(*sets: str) -> str:
    found = problems(*sets)
    assert len(found) == 1, found
    return found[0].field


# --------------------------------------------------------------------------- applied


def test_sets_change_any_field_and_keep_the_rest_of_the_section():
    spec = load_spec(SPEC, sets=["search.max_batch_size=512", "training.precision=bf16-mixed",
                                 "model.kwargs.channels=8", "input.shape=[3, 32, 32]"])
    assert spec.search.max_batch_size == 512
    assert spec.search.steps == 2 and spec.search.trial_timeout == 120  # the file's other search fields
    assert spec.training.precision == "bf16-mixed"
    assert spec.model.kwargs == {"channels": 8, "classes": 10}
    assert spec.input.shape == [3, 32, 32]


def test_the_value_is_yaml_split_at_the_first_equals_sign():
    spec = load_spec(SPEC, sets=["allocator=expandable_segments:True,max_split_size_mb=128",
                                 "optimizer.kwargs={lr: 0.5, momentum: 0.9}"])
    assert spec.allocator == "expandable_segments:True,max_split_size_mb=128"
    assert spec.optimizer.kwargs == {"lr": 0.5, "momentum": 0.9}


def test_an_empty_value_is_null():
    assert load_spec(SPEC).memory_budget is not None
    assert load_spec(SPEC, sets=["memory_budget="]).memory_budget is None


def test_the_last_set_of_a_field_wins_and_a_named_flag_wins_over_a_set():
    assert load_spec(SPEC, sets=["search.max_batch_size=8", "search.max_batch_size=16"]).search.max_batch_size == 16
    flag = load_spec(SPEC, {"--max-batch-size": "32"}, sets=["search.max_batch_size=8"])
    assert flag.search.max_batch_size == 32
    whole = load_spec(SPEC, sets=["search.steps=5", "search={max_batch_size: 64}"])  # a section replaced whole
    assert whole.search.max_batch_size == 64 and whole.search.steps != 5


def test_a_set_value_changes_the_cache_key():
    from isoprobe.cache.store import cache_key, key_material

    def key(*sets: str) -> str:
        return cache_key(key_material(load_spec(SPEC, sets=sets), str(SPEC), {}, None))

    plain = key()
    assert key("search.max_batch_size=512") != plain
    assert key("search.max_batch_size=512") != key("search.max_batch_size=256")
    assert key("search.max_batch_size=512") == key("search.max_batch_size=512")
    assert key("memory_budget=1.25GiB") == plain  # the value the file already has: the same setup, the same key


# --------------------------------------------------------------------------- refused, named by the flag


def test_a_value_of_the_wrong_type_is_named_by_its_flag():
    found = problems("search.max_batch_size=abc")
    assert [p.field for p in found] == ["search.max_batch_size (from --set search.max_batch_size=abc)"]
    assert "integer" in found[0].message


def test_no_equals_sign_is_a_problem_of_that_flag():
    found = problems("search.max_batch_size")
    assert found[0].field == "--set search.max_batch_size"
    assert "no '='" in found[0].message and "FIELD=VALUE" in found[0].fix


@pytest.mark.parametrize("text", ["=3", ".steps=3", "search..steps=3", "search. steps=3"])
def test_a_malformed_field_path_is_refused(text):
    found = problems(text)
    assert found[0].field == f"--set {text}" and "not a dotted field path" in found[0].message


def test_an_unknown_field_is_the_usual_message_with_the_flag():
    found = problems("search.max_batchsize=4")
    assert found[0].field == "search.max_batchsize (from --set search.max_batchsize=4)"
    assert found[0].message == "unknown field 'max_batchsize'"
    assert "did you mean 'max_batch_size'?" in found[0].fix


def test_an_unknown_section_is_named_by_the_flag_that_made_it():
    found = problems("serch.steps=3")
    assert found[0].field == "serch (from --set serch.steps=3)"
    assert "did you mean 'search'?" in found[0].fix


def test_a_path_through_a_value_is_refused_not_ignored():
    found = problems("device.index=1")  # device: cpu is valid: without this problem the --set would vanish
    assert found[0].field == "device.index (from --set device.index=1)"
    assert "device is str 'cpu', not a section" in found[0].message


def test_every_problem_at_once():
    found = problems("search.max_batch_size=abc", "nothing", "training.precision=fp8")
    assert {p.field for p in found} == {"--set nothing", "search.max_batch_size (from --set search.max_batch_size=abc)",
                                        "training.precision (from --set training.precision=fp8)"}


def test_a_yaml_syntax_error_in_a_value():
    found = problems("input.shape=[3, 64")
    assert found[0].field == "input.shape (from --set input.shape=[3, 64)"
    assert found[0].message.startswith("not valid YAML")


# --------------------------------------------------------------------------- the spec file's YAML rules apply


def test_a_huge_number_is_refused_before_it_is_built_and_the_flag_is_shortened():
    found = problems("search.max_batch_size=" + "9" * 5000)
    assert found[0].message == "a number with 5000 digits is far beyond any value a spec takes"
    assert found[0].field.startswith("search.max_batch_size (from --set search.max_batch_size=999")
    assert "(5022 characters)" in found[0].field and len(found[0].field) < 120


def test_an_infinite_number_is_refused():
    found = problems("recommendation.headroom=1.0e+400")  # YAML 1.1: a float exponent has a sign
    assert "not a finite number" in found[0].message
    assert found[0].field == "recommendation.headroom (from --set recommendation.headroom=1.0e+400)"


def test_a_yaml_alias_bomb_is_refused():
    bomb = ("model.kwargs={a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a], "
            "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b], d: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]}")
    found = problems(bomb)
    assert found[0].message.startswith("expands to more than 10000 values")
    assert found[0].field.startswith("model.kwargs (from --set model.kwargs={a: &a")


def test_deep_nesting_is_refused():
    found = problems("model.kwargs=" + "[" * 100)
    assert found[0].message.startswith("nested too deeply to be a spec")


def test_a_number_deep_in_a_value_is_named_by_its_own_path():
    found = problems("model.kwargs={depth: 1.0e+999}")
    assert found[0].field == "model.kwargs.depth (from --set model.kwargs={depth: 1.0e+999})"


def test_tags_that_build_no_plain_value_are_refused():
    found = problems("model.kwargs={blob: !!binary aGVsbG8=}")
    assert "!!binary" in found[0].message and found[0].field.startswith("model.kwargs.blob (from --set")


# --------------------------------------------------------------------------- the command line


def test_validate_takes_sets_and_shows_the_result():
    run = cli("validate", str(SPEC), "--set", "training.precision=bf16-mixed", "--set", "search.max_batch_size=64")
    assert run.returncode == 0, run.stderr
    assert "train bf16-mixed" in run.stdout


def test_validate_names_the_flag_in_its_error():
    run = cli("validate", str(SPEC), "--set", "search.max_batch_size=abc")
    assert run.returncode == 2
    assert "search.max_batch_size (from --set search.max_batch_size=abc)" in run.stderr
    assert "Traceback" not in run.stderr


def test_run_refuses_a_bad_set_before_any_trial():
    run = cli("run", str(SPEC), "--set", "serch.steps=3", "--format", "json")
    assert run.returncode == 2
    assert "serch (from --set serch.steps=3): unknown field 'serch'" in run.stderr
    assert "trial" not in run.stderr
    stopped = json.loads(run.stdout)  # every stop prints its document (issue 56)
    assert stopped["stop_reason"] == "bad_spec" and "unknown field 'serch'" in stopped["message"]


def test_run_in_hook_mode_answers_a_bad_set_with_the_fallback():
    run = cli("run", str(SPEC), "--set", "search.max_batch_size", "--format", "env", "--fallback-batch-size", "8")
    assert run.returncode == 0
    assert "ISOPROBE_BATCH_SIZE=8" in run.stdout
    assert "--set search.max_batch_size" in run.stderr


@pytest.mark.parametrize("command", ["run", "validate"])
def test_help_documents_set(command):
    run = cli(command, "--help")
    assert run.returncode == 0
    assert "--set FIELD=VALUE" in run.stdout and "win over a --set" in run.stdout


def test_a_set_memory_budget_is_reported_as_from_the_command_line():
    from isoprobe.cli.main import _parser
    from isoprobe.cli.common import budget_overridden as _budget_overridden

    def overridden(*argv: str) -> bool:
        return _budget_overridden(_parser().parse_args(["run", str(SPEC), *argv]))

    assert not overridden()
    assert not overridden("--set", "search.max_batch_size=8")
    assert overridden("--set", "memory_budget=2GiB")
    assert overridden("--memory-budget", "2GiB")


# --------------------------------------------------------------------------- list elements (input.shape.0)


def test_a_number_in_the_path_sets_one_element_of_a_list():
    spec = load_spec(SPEC, sets=["input.shape.1=32", "input.shape.2=48"])
    assert list(spec.input.shape) == [3, 32, 48]


@pytest.mark.parametrize("text, said", [("input.shape.3=8", "is not the index of one of its 3 element(s)"),
                                        ("input.shape.x=8", "not a section of fields")])
def test_an_index_a_list_does_not_have_is_named(text, said):
    found = problems(text)
    assert len(found) == 1 and found[0].field == f"{text.split('=')[0]} (from --set {text})", found
    assert said in found[0].message
