"""issue 20, defects 1 (every ``allocators`` entry checked before any trial), 8 (bf16 by the trial device's
compute capability) and the invalid ``cuda:N``. torch's own parser runs here (it needs no GPU)."""

from __future__ import annotations

import types

import pytest

from isoprobe.child.core import cuda as child_cuda
from isoprobe.child import environment_check
from isoprobe.spec.model import Spec

torch = pytest.importorskip("torch")


def _spec(**extra) -> Spec:
    return Spec.model_validate({"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 32, 32]},
                                "target": {"classes": 10}, **extra})


@pytest.mark.parametrize(("capability", "supported"), [((7, 0), False), ((7, 5), False), ((8, 0), True),
                                                        ((8, 6), True), ((9, 0), True), ((12, 0), True)])
def test_bf16_needs_compute_capability_8(capability, supported):
    assert child_cuda.bf16_supported(capability) is supported


def _fake_torch(capability):
    cuda = types.SimpleNamespace(get_device_capability=lambda device: capability,
                                 get_device_name=lambda device: "Tesla V100-SXM2-16GB",
                                 is_bf16_supported=lambda: True)  # what torch says under emulation: never asked
    return types.SimpleNamespace(cuda=cuda, float16=torch.float16, bfloat16=torch.bfloat16)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_a_pre_ampere_trial_device_refuses_bf16_whatever_is_bf16_supported_says(precision):
    problems = environment_check._check_precision(_fake_torch((7, 0)), _spec(training={"precision": precision}),
                                              types.SimpleNamespace(type="cuda", index=0))
    assert [p.stage for p in problems] == ["precision"]
    assert "compute capability 7.0" in problems[0].message and "8.0" in problems[0].message


@pytest.mark.parametrize(("setting", "rejected"), [
    ("expandable_segments:True", None),
    ("expandable_segments:true", "Expected 'True' or 'False'"),
    ("no_such_key:1", "Unrecognized key 'no_such_key'"),
    ("max_split_size_mb:128,garbage_collection_threshold:0.6", None),
    ("backend:cudaMallocAsync", None),  # the backend cannot be re-parsed in a live process: checked by value
    ("backend:cudaMalloc", "backend must be native or cudaMallocAsync"),
])
def test_torchs_parser_judges_each_allocator_setting(setting, rejected):
    reason = child_cuda.allocator_setting_problem(torch, setting)
    if rejected is None:
        assert reason is None
    else:
        assert rejected in reason


def test_every_allocators_entry_is_checked_and_the_bad_one_named():
    spec = _spec(allocators=["default", "expandable_segments:True", "max_split_size_mb:128", "expandable_segment:True"])
    problems = environment_check._allocator_problems(torch, spec)
    assert [p.stage for p in problems] == ["allocator"]
    assert "allocators entry 'expandable_segment:True'" in problems[0].message
    assert environment_check._allocator_problems(torch, _spec(allocators=["default", "expandable_segments:True"])) == []


def test_a_cuda_init_failure_is_an_allocator_problem_only_when_torch_speaks_of_the_allocator():
    assert environment_check._allocator_message("Unrecognized key 'x' in Accelerator allocator config.")
    assert environment_check._allocator_message("Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'")
    assert not environment_check._allocator_message("Found no NVIDIA driver on your system.")


@pytest.mark.parametrize(("device", "count", "index"), [("auto", 2, 0), ("cuda", 1, 0), ("cuda:1", 2, 1),
                                                        ("cuda:3", 2, None), ("cpu", 2, None), ("auto", 0, None)])
def test_the_inspect_child_asks_only_the_trials_gpu_and_never_a_missing_one(device, count, index):
    # Only this index gets a context (mem_get_info); a cuda:N beyond the count is left to resolve_target's spec error.
    assert environment_check._target_index(_spec(device=device), count) == index
