"""isoprobe.huggingface: how a Trainer function is named to the child, and the spec find_batch_size asks for."""

from __future__ import annotations

import os

import pytest

from isoprobe import huggingface
from isoprobe.errors import SpecError


def top_level(batch_size):
    return batch_size


def test_a_top_level_modules_function_is_named_by_its_file():
    assert huggingface.reference(top_level) == f"{os.path.abspath(__file__)}:top_level"


def test_a_packages_function_is_named_by_its_module():
    assert huggingface.reference(huggingface.reference) == "isoprobe.huggingface:reference"


def test_a_string_is_taken_as_it_is():
    assert huggingface.reference("train.py:build") == "train.py:build"


def test_a_nested_function_or_lambda_cannot_be_named():
    def inner(batch_size):
        return batch_size

    for function in (inner, lambda batch_size: batch_size):
        with pytest.raises(ValueError, match="top level"):
            huggingface.reference(function)


def test_the_spec_it_asks_for(monkeypatch):
    asked = {}

    def fake_probe(spec, **options):
        asked.update(spec=spec, options=options)
        return "result"

    monkeypatch.setattr("isoprobe.api.probe", fake_probe)
    assert huggingface.find_batch_size(top_level, kwargs={"layers": 2}, memory_budget="2GiB", target_global_batch=64,
                                       eval_pass=True, quiet=True) == "result"
    assert asked["spec"] == {"model": {"hf_trainer": f"{os.path.abspath(__file__)}:top_level", "kwargs": {"layers": 2}},
                             "training": {"eval_pass": True}, "plan": {"target_global_batch": 64}}
    assert asked["options"]["memory_budget"] == "2GiB" and asked["options"]["quiet"] is True


def test_a_spec_mistake_is_a_spec_error_naming_the_override(tmp_path):
    with pytest.raises(SpecError) as info:
        huggingface.find_batch_size(top_level, overrides={"training.precision": "bf16-mixed"}, quiet=True)
    assert "'training.precision'" in str(info.value)
