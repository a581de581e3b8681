"""issue 45, items 8, 11 and 12: which GPU (or MIG instance) a trial uses, as the parent can tell it without CUDA.

- MIG (item 8). With MIG enabled, CUDA enumerates MIG instances, named in CUDA_VISIBLE_DEVICES by their
  ``MIG-`` UUIDs; unset (or naming the parent GPU) CUDA picks an instance itself (NVIDIA's MIG user guide, "CUDA
  Device Enumeration"). The cache key must then hold the instance's size, or the cache must not be used.
- Device order (item 12). A number in CUDA_VISIBLE_DEVICES is CUDA's index, in CUDA_DEVICE_ORDER's order
  (FASTEST_FIRST unless the user says PCI_BUS_ID); NVML counts by PCI bus. Trials keep the user's order, and the
  parent trusts a number only where the two orders cannot name different kinds of GPU.
- Parallel slots (item 11). Slots start at the spec's device, and every slot's GPU is the target's kind with as
  much free memory.

The fake NVML follows the style of tests/unit/test_hardware.py, with MIG's calls added (pynvml's names).
"""

from __future__ import annotations

import sys
import types

import pytest

from isoprobe.cache import store as cache
from isoprobe.errors import SpecError
from isoprobe.executors import processes
from isoprobe.executors.processes import child_environment
from isoprobe.pipeline.environment import Target
from isoprobe.pipeline.parallel import resolve_slots
from isoprobe.report.device import DeviceInfo
from isoprobe.spec.model import Spec
from isoprobe.system.hardware import nvml_devices, nvml_gpus, slurm_cuda_visible, visible_devices

GiB = 1024**3
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


class _FakeNvml(types.ModuleType):
    """GPUs as NVML lists them (PCI order), each ``(uuid, name, GiB, mig_instances)``; a MIG instance is
    ``(uuid, profile, GiB)``. A GPU with instances has MIG mode enabled."""

    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1

    class NVMLError(Exception):
        pass

    def __init__(self, devices, free=None):
        super().__init__("pynvml")
        self.devices = devices
        self.free = free or {}  # uuid -> free GiB (default: all of it)

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetIndex(self, handle):
        return handle[1]

    def nvmlDeviceGetMinorNumber(self, handle):
        return handle[1]

    def _facts(self, handle):
        if handle[0] == "gpu":
            uuid, name, gib, _ = self.devices[handle[1]]
            return uuid, name, gib
        uuid, profile, gib = self.devices[handle[1]][3][handle[2]]
        return uuid, f"{self.devices[handle[1]][1]} MIG {profile}", gib

    def nvmlDeviceGetUUID(self, handle):
        return self._facts(handle)[0]

    def nvmlDeviceGetName(self, handle):
        return self._facts(handle)[1]

    def nvmlDeviceGetMemoryInfo(self, handle):
        uuid, _, gib = self._facts(handle)
        return types.SimpleNamespace(total=gib * GiB, free=int(self.free.get(uuid, gib) * GiB))

    def nvmlDeviceGetMigMode(self, handle):
        if handle[0] != "gpu":
            raise self.NVMLError("Not Supported")
        mode = self.NVML_DEVICE_MIG_ENABLE if self.devices[handle[1]][3] else self.NVML_DEVICE_MIG_DISABLE
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7 if self.devices[handle[1]][3] else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        if index >= len(self.devices[handle[1]][3]):
            raise self.NVMLError("Not Found")  # an empty slot of the seven
        return ("mig", handle[1], index)


#: GPU 0 split into a 3g.40gb and a 1g.10gb instance; GPU 1 whole.
MIG_NODE = [("GPU-aaaa", A100, 80, [("MIG-3333", "3g.40gb", 40), ("MIG-1111", "1g.10gb", 10)]),
            ("GPU-bbbb", A100, 80, [])]
#: Two A100s and an H100 in PCI order: under CUDA's default order (fastest first) the H100 is cuda:0.
MIXED_NODE = [("GPU-aaaa", A100, 80, []), ("GPU-bbbb", A100, 80, []), ("GPU-cccc", H100, 80, [])]
IDENTICAL_NODE = [(f"GPU-{c * 4}", A100, 80, []) for c in "abcd"]


@pytest.fixture
def node(monkeypatch):
    def install(devices, free=None):
        fake = _FakeNvml(devices, free)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake
    return install


def _spec(device: str, **search) -> Spec:
    return Spec.model_validate({"model": {"torchvision": "resnet18"}, "input": {"shape": [3, 32, 32]},
                                "target": {"classes": 10}, "device": device, "search": search})


def _gpus(environ):
    return nvml_gpus(visible_devices(environ))


# --- item 8: MIG -------------------------------------------------------------------------------------------------

def test_a_mig_uuid_keys_the_cache_by_the_instance_not_the_parent_gpu(node, tmp_path):
    node(MIG_NODE)
    small, large = _gpus({"CUDA_VISIBLE_DEVICES": "MIG-1111"}), _gpus({"CUDA_VISIBLE_DEVICES": "MIG-3333"})
    assert [(g["uuid"], g["total_memory_bytes"]) for g in small] == [("MIG-1111", 10 * GiB)]
    assert "1g.10gb" in small[0]["name"]
    spec = _spec("cuda")
    keys = [cache.key_material(spec, str(tmp_path / "s.yaml"), {}, gpus)["device"] for gpus in (small, large)]
    assert keys[0] != keys[1]  # a 3g.40gb answer is never served to a 1g.10gb job
    assert keys[0]["gpus"][0]["total_memory_bytes"] == 10 * GiB and keys[0]["gpus"][0].get("mig_instance") is True
    assert cache.uncacheable_gpu_probe(spec, small, {"CUDA_VISIBLE_DEVICES": "MIG-1111"}) is None


@pytest.mark.parametrize("environ", [{}, {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"},
                                     {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}])
def test_a_mig_gpu_named_by_number_or_not_at_all_uses_no_cache(node, environ):
    # CUDA picks the instance itself: the parent cannot tell a 3g.40gb from a 1g.10gb, so no parent GPU's facts.
    node(MIG_NODE)
    gpus = _gpus(environ)
    assert not gpus
    reason = cache.uncacheable_gpu_probe(_spec("cuda"), gpus, environ, gpu_present=True)
    assert reason is not None and "cache is not used" in reason and "MIG" in reason


def test_slurm_numbers_on_a_mig_node_are_not_turned_into_a_parent_gpu_uuid(node):
    node(MIG_NODE)
    devices = nvml_devices()
    assert devices[0]["mig_enabled"] and not devices[1]["mig_enabled"]
    assert [m["uuid"] for m in devices[0]["mig_devices"]] == ["MIG-3333", "MIG-1111"]
    assert slurm_cuda_visible(["0"], devices) == "0"  # a GPU- UUID would hide the instances from CUDA
    assert slurm_cuda_visible(["MIG-1111"], devices) == "MIG-1111"
    assert slurm_cuda_visible(["1"], [d for d in devices if not d["mig_enabled"]]) == "GPU-bbbb"


# --- item 12: CUDA_DEVICE_ORDER ----------------------------------------------------------------------------------

def test_trials_keep_the_users_device_order(monkeypatch, tmp_path):
    monkeypatch.setattr(processes, "node_gpus", lambda: None)
    env = child_environment({"CUDA_VISIBLE_DEVICES": "0"}, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert "CUDA_DEVICE_ORDER" not in env  # CUDA's default (fastest first), as in the user's job
    env = child_environment({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, backend="cuda", allocator=None,
                            events_path=tmp_path / "e")
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


@pytest.mark.parametrize(("devices", "environ", "expected"), [
    (MIXED_NODE, {"CUDA_VISIBLE_DEVICES": "2"}, None),                           # fastest first: the H100 is 0
    (MIXED_NODE, {}, None),                                                      # which one is cuda:0?
    (MIXED_NODE, {"CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [H100]),
    (MIXED_NODE, {"CUDA_VISIBLE_DEVICES": "GPU-cccc,GPU-aaaa"}, [H100, A100]),  # UUIDs name one GPU in any order
    (IDENTICAL_NODE, {"CUDA_VISIBLE_DEVICES": "2"}, [A100]),                     # any of them has these facts
    (IDENTICAL_NODE, {}, [A100] * 4),
])
def test_a_number_is_trusted_only_where_the_orders_cannot_disagree(node, devices, environ, expected):
    node(devices)
    gpus = _gpus(environ)
    assert (None if gpus is None else [g["name"] for g in gpus]) == expected
    reason = cache.uncacheable_gpu_probe(_spec("cuda"), gpus, environ, gpu_present=True)
    if expected is None:
        assert reason is not None and "CUDA_DEVICE_ORDER" in reason
    else:
        assert reason is None


# --- item 11: parallel slots -------------------------------------------------------------------------------------

def _target(device: str, budget: int | None = None) -> Target:
    index = 0 if device == "cuda" else int(device.split(":")[1])
    return Target("cuda", f"cuda:{index}", DeviceInfo(backend="cuda", requested=device, name=A100, index=index,
                                                      total_memory_bytes=80 * GiB, memory_budget_bytes=budget,
                                                      capacity_bytes=budget or 80 * GiB))


def test_parallel_slots_start_at_the_specs_device(node, monkeypatch):
    node(IDENTICAL_NODE)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(name, raising=False)
    assert resolve_slots(_spec("cuda:2", parallel=2), _target("cuda:2"), print) == ["cuda:2", "cuda:3"]
    assert resolve_slots(_spec("cuda:1", parallel="auto"), _target("cuda:1"), print) == ["cuda:1", "cuda:2", "cuda:3"]
    with pytest.raises(SpecError) as refused:
        resolve_slots(_spec("cuda:3", parallel=2), _target("cuda:3"), print)
    [problem] = refused.value.problems
    assert problem.field == "search.parallel" and "cuda:3" in problem.message and "cuda:4" in problem.message


def test_a_slot_gpu_with_less_free_memory_than_the_target_is_refused(node, monkeypatch):
    node(IDENTICAL_NODE, free={"GPU-bbbb": 70})  # another job's 10 GiB on cuda:1
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SpecError) as refused:
        resolve_slots(_spec("cuda", parallel=2), _target("cuda"), print)
    [problem] = refused.value.problems
    assert problem.field == "search.parallel" and "cuda:1" in problem.message and "free" in problem.message
    # Under a budget the slot only needs the budget free.
    assert resolve_slots(_spec("cuda", parallel=2), _target("cuda", budget=8 * GiB), print) == ["cuda:0", "cuda:1"]
    assert resolve_slots(_spec("cuda:2", parallel=2), _target("cuda:2"), print) == ["cuda:2", "cuda:3"]


def test_parallel_slots_refuse_gpus_the_parent_cannot_tell_apart(node, monkeypatch):
    node(MIXED_NODE)
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SpecError) as refused:
        resolve_slots(_spec("cuda", parallel=2), _target("cuda"), print)
    assert "CUDA_DEVICE_ORDER" in refused.value.problems[0].message
