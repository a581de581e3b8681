"""Which GPUs a run may use (CUDA's and Slurm's variables) and their NVML facts, with a fake NVML."""

from __future__ import annotations

import sys
import types

import pytest

from isoprobe.system.hardware import nvml_gpus, run_environment, visible_devices
from isoprobe.executors.processes import child_environment


@pytest.mark.parametrize(
    "environ, value, source",
    [
        ({}, None, "none"),
        ({"SLURM_JOB_GPUS": "2,3"}, "2,3", "SLURM_JOB_GPUS"),
        ({"SLURM_JOB_GPUS": "2,3", "SLURM_STEP_GPUS": "3"}, "3", "SLURM_STEP_GPUS"),
        ({"SLURM_STEP_GPUS": "3", "CUDA_VISIBLE_DEVICES": "0"}, "0", "CUDA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_GPUS": "1"}, "", "CUDA_VISIBLE_DEVICES"),  # empty: no GPU
        ({"SLURM_JOB_GPUS": "  "}, None, "none"),
    ],
)
def test_visible_devices_follow_cuda_then_step_then_job(environ, value, source):
    visible = visible_devices(environ)
    assert (visible.value, visible.source) == (value, source)


def test_a_cuda_trial_gets_the_jobs_gpus_when_only_slurm_names_them(tmp_path, monkeypatch):
    # Without NVML the node's numbers pass on as they are (the cgroup cases: tests/unit/test_cuda_slurm_gpus.py).
    monkeypatch.setattr("isoprobe.executors.processes.node_gpus", lambda: None)
    env = child_environment({"SLURM_JOB_GPUS": "2,3"}, backend="cuda", allocator=None, events_path=tmp_path / "e")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    env = child_environment({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "1"}, backend="cuda",
                            allocator=None, events_path=tmp_path / "e")
    assert env["CUDA_VISIBLE_DEVICES"] == "1"  # CUDA's own variable wins, as in CUDA itself
    env = child_environment({"SLURM_JOB_GPUS": "2,3"}, backend="cpu", allocator=None, events_path=tmp_path / "e")
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU trial never sees a GPU


def test_run_environment_records_the_job_and_its_gpus():
    environ = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node7", "SLURM_JOB_GPUS": "1", "SLURM_ARRAY_TASK_ID": "3"}
    block = run_environment(environ, gpus=None)
    assert block["slurm_job_id"] == "42" and block["slurm_node"] == "node7" and block["slurm_array_task_id"] == "3"
    assert (block["cuda_visible_devices"], block["visible_devices_source"]) == ("1", "SLURM_JOB_GPUS")
    assert run_environment({}, None)["slurm_node"] is None


class _FakeNvml(types.ModuleType):
    """Two A100s and an H100 as NVML would list them (driver indices 0, 1, 2)."""

    class NVMLError(Exception):
        pass

    def __init__(self, fail_init: bool = False):
        super().__init__("pynvml")
        self.fail_init = fail_init
        self.shut = False
        self.devices = [("GPU-aaa", "NVIDIA A100-SXM4-80GB", 80), ("GPU-bbb", "NVIDIA A100-SXM4-80GB", 80),
                        ("GPU-ccc", "NVIDIA H100 80GB HBM3", 80)]

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.devices):
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for index, device in enumerate(self.devices):
            if device[0] == uuid:
                return index
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetIndex(self, handle):
        return handle

    def nvmlDeviceGetUUID(self, handle):
        return self.devices[handle][0]

    def nvmlDeviceGetName(self, handle):
        return self.devices[handle][1]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(total=self.devices[handle][2] * 1024**3)


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_nvml_lists_the_visible_gpus_in_cudas_order(fake_nvml):
    # A mixed node: a number names NVML's GPU only in PCI order, which the user's CUDA_DEVICE_ORDER sets (issue 45).
    gpus = nvml_gpus(visible_devices({"CUDA_VISIBLE_DEVICES": "2,GPU-aaa", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}))
    assert [(g["nvml_index"], g["name"]) for g in gpus] == [(2, "NVIDIA H100 80GB HBM3"), (0, "NVIDIA A100-SXM4-80GB")]
    assert gpus[0]["driver_version"] == "550.54.15" and gpus[0]["total_memory_bytes"] == 80 * 1024**3
    assert fake_nvml.shut


def test_nvml_stops_at_the_first_entry_that_names_no_gpu_as_cuda_does(fake_nvml):
    pci = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert [g["nvml_index"] for g in nvml_gpus(visible_devices({"CUDA_VISIBLE_DEVICES": "1,7,0", **pci}))] == [1]
    assert nvml_gpus(visible_devices({"CUDA_VISIBLE_DEVICES": ""})) == []
    assert len(nvml_gpus(visible_devices(pci))) == 3


def test_without_a_driver_nvml_answers_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(fail_init=True))
    assert nvml_gpus(visible_devices({})) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert nvml_gpus(visible_devices({})) is None
