"""issue 20, defects 6 and 7 and the trial environment: Slurm's GPU numbers under device cgroups, the cache
policy for a CUDA probe whose GPU NVML cannot name, CUDA_DEVICE_ORDER and PYTORCH_NO_CUDA_MEMORY_CACHING.
(MIG and CUDA's device order as the parent tells them: tests/unit/test_cuda_visibility.py.)"""

from __future__ import annotations

import pytest

from isoprobe.cache import store as cache
from isoprobe.executors import processes
from isoprobe.executors.processes import child_environment
from isoprobe.system.hardware import Visible, select_visible, slurm_cuda_visible
from isoprobe.spec.model import Spec

GiB = 1024**3


def _device(index: int, minor: int, uuid: str) -> dict:
    return {"nvml_index": index, "minor_number": minor, "uuid": uuid, "name": "NVIDIA A100-SXM4-80GB",
            "total_memory_bytes": 80 * GiB, "driver_version": "550.54.15"}


#: A 4-GPU node seen whole: NVML indices equal minor numbers.
NODE = [_device(i, i, f"GPU-{'abcd'[i] * 8}-0000") for i in range(4)]
#: The same node's GPUs 2 and 3 inside a device cgroup (or a container): renumbered 0 and 1, minors kept.
CGROUP = [_device(0, 2, "GPU-cccccccc-0000"), _device(1, 3, "GPU-dddddddd-0000")]


@pytest.mark.parametrize(("entries", "devices", "expected"), [
    (["2", "3"], CGROUP, "GPU-cccccccc-0000,GPU-dddddddd-0000"),  # renumbered: resolved by minor number
    (["2", "3"], NODE, "GPU-cccccccc-0000,GPU-dddddddd-0000"),    # whole node: the same GPUs, by UUID
    (["3", "2"], NODE, "GPU-dddddddd-0000,GPU-cccccccc-0000"),    # Slurm's order kept
    (["2", "3"], [{**d, "minor_number": None} for d in CGROUP], None),  # no minors, as many as listed: leave alone
    (["2", "3"], None, "2,3"),                                    # no NVML: the numbers, right where nothing renumbers
    (["GPU-cccccccc-0000"], CGROUP, "GPU-cccccccc-0000"),         # UUIDs pass as they are
    (["MIG-1234"], None, "MIG-1234"),
    ([], NODE, ""),
])
def test_slurm_numbers_become_what_cuda_needs(entries, devices, expected):
    assert slurm_cuda_visible(entries, devices) == expected


def test_a_trial_in_a_cgroup_gets_the_jobs_gpus_not_none(monkeypatch, tmp_path):
    monkeypatch.setattr(processes, "node_gpus", lambda: CGROUP)
    env = child_environment({"SLURM_JOB_GPUS": "2,3"}, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-cccccccc-0000,GPU-dddddddd-0000"
    assert "CUDA_DEVICE_ORDER" not in env  # the job's order, CUDA's default (issue 45, item 12)
    env = child_environment({"SLURM_JOB_GPUS": "2,3", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, backend="cuda",
                            allocator=None, events_path=tmp_path / "e")
    assert env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"  # the user's choice stands


def test_caching_off_is_removed_from_every_trial(tmp_path):
    for backend in ("cuda", "cpu"):
        env = child_environment({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, backend=backend, allocator=None,
                                events_path=tmp_path / "e")
        assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in env


@pytest.mark.parametrize(("visible", "expected"), [
    (Visible("2,3", "SLURM_JOB_GPUS"), ["GPU-cccccccc-0000", "GPU-dddddddd-0000"]),  # minors, in the cgroup too
    (Visible("1", "CUDA_VISIBLE_DEVICES"), ["GPU-dddddddd-0000"]),                  # CUDA's index (PCI order)
    (Visible("GPU-ccc", "CUDA_VISIBLE_DEVICES"), ["GPU-cccccccc-0000"]),            # a prefix CUDA accepts
    (Visible("GPU-", "CUDA_VISIBLE_DEVICES"), []),                                  # ambiguous prefix: none
    (Visible(None, "none"), ["GPU-cccccccc-0000", "GPU-dddddddd-0000"]),
])
def test_the_cache_keys_gpus_are_the_trials_gpus(visible, expected):
    assert [d["uuid"] for d in select_visible(CGROUP, visible)] == expected


def _spec(device: str) -> Spec:
    return Spec.model_validate({"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 32, 32]},
                                "target": {"classes": 10}, "device": device})


@pytest.mark.parametrize(("device", "gpus", "environ", "present", "refused"), [
    ("cuda", None, {}, True, True),                           # NVML cannot answer: no CPU key for a GPU probe
    ("cuda:1", [], {}, True, True),                           # NVML named no GPU (a prefix it does not accept)
    ("auto", None, {}, True, True),                           # auto with a GPU the driver shows
    ("auto", None, {}, False, False),                         # auto on a CPU machine: the CPU key is right
    ("auto", None, {"CUDA_VISIBLE_DEVICES": ""}, True, False),  # every GPU hidden: a CPU probe
    ("cpu", None, {}, True, False),
    ("cuda", [NODE[0]], {}, True, False),                     # the GPU's facts are in the key
])
def test_a_cuda_probe_without_gpu_facts_uses_no_cache(device, gpus, environ, present, refused):
    reason = cache.uncacheable_gpu_probe(_spec(device), gpus, environ, gpu_present=present)
    assert (reason is not None) is refused
    if refused:
        assert "NVML" in reason and "cache is not used" in reason


def test_answer_neither_reads_nor_writes_the_cache_for_such_a_probe(monkeypatch, tmp_path):
    from isoprobe.report.output import Reporter
    from isoprobe.pipeline import answer as answer_module

    monkeypatch.setattr("isoprobe.system.hardware.nvml_devices", lambda: None)
    probed = []

    class _Probed(Exception):
        pass

    def probe(self, cache):
        probed.append(cache)
        raise _Probed

    monkeypatch.setattr(answer_module._Context, "probe", probe)
    monkeypatch.setattr(answer_module._Context, "cached", lambda self, c, k: pytest.fail("the cache was read"))
    lines: list[str] = []
    with pytest.raises(_Probed):
        answer_module.answer(_spec("cuda"), str(tmp_path / "s.yaml"), Reporter(lines.append),
                             environ={"ISOPROBE_CACHE_DIR": str(tmp_path / "cache")})
    assert probed == [None] and any("cache is not used" in line for line in lines)
    assert not (tmp_path / "cache").exists()
