"""What this machine has, learned without a CUDA context: the visible GPUs, their facts, the CPU.

The parent must never initialise CUDA: a context holds several hundred MiB on the
GPU the trials measure. Yet the result cache needs the GPU's model, memory and
driver for its key, before any child starts. NVML (``nvidia-ml-py``) asks the
driver and creates no context, so it answers here; where it is missing (no
driver, a CPU machine) the facts are ``None`` and the caller uses the CPU's.

The visible set follows CUDA's rules and Slurm's conventions: ``CUDA_VISIBLE_DEVICES``
when set (even empty: no GPU), else ``SLURM_STEP_GPUS`` (an srun step's GPUs),
else ``SLURM_JOB_GPUS`` (a batch shell gets only this). Slurm exports
``CUDA_VISIBLE_DEVICES`` itself for steps that ask for GPUs, but a hook or a batch
shell can see only the job's list; the trials must then use the job's GPUs, not
GPU 0 of the node, so :func:`visible_devices` tells the local executor what to pass on.
"""

from __future__ import annotations

import functools
import os
import platform
import socket
from pathlib import Path
from collections.abc import Mapping
from dataclasses import dataclass

#: In order of precedence; the first one set decides.
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")


@dataclass(frozen=True)
class Visible:
    """The GPUs the trials may use: ``value`` as CUDA_VISIBLE_DEVICES would hold it, or None for all."""

    value: str | None
    source: str  # one of VISIBILITY_VARIABLES, or "none"

    @property
    def entries(self) -> list[str] | None:
        if self.value is None:
            return None
        return [entry.strip() for entry in self.value.split(",") if entry.strip()]


def visible_devices(environ: Mapping[str, str]) -> Visible:
    """Pure: which GPUs a process started with ``environ`` may use, and which variable said so."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return Visible(environ["CUDA_VISIBLE_DEVICES"].strip(), "CUDA_VISIBLE_DEVICES")
    for name in VISIBILITY_VARIABLES[1:]:
        value = environ.get(name, "").strip()
        if value:
            return Visible(value, name)
    return Visible(None, "none")


def nvml_gpus(visible: Visible) -> list[dict] | None:
    """The visible GPUs in CUDA's order, each ``{nvml_index, uuid, name, total_memory_bytes, driver_version}``.

    None where NVML cannot answer (library or driver missing). Which devices the
    visible list names is ``select_visible``'s rule. With no restriction the order is
    NVML's (PCI bus order), which is CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    (what the trials get, ``executors.processes.child_environment``).
    """
    devices = nvml_devices()
    if devices is None:
        return None
    return [{k: d[k] for k in ("nvml_index", "uuid", "name", "total_memory_bytes", "driver_version")}
            for d in select_visible(devices, visible)]


def select_visible(devices: list[dict], visible: Visible) -> list[dict]:
    """Pure: the devices (``nvml_devices``' entries) that ``visible`` names, in its order.

    An entry is a UUID or a prefix of one (``GPU-...``, ``MIG-...``; CUDA accepts a unique
    prefix, NVML's lookup does not), or a number. A number in ``CUDA_VISIBLE_DEVICES`` is
    CUDA's index, which is NVML's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; a number from
    Slurm's variables is the node's GPU number, the device's minor number (``/dev/nvidiaN``),
    which stays the same when a device cgroup or a container renumbers what the job sees. Like
    CUDA, the list ends at the first entry that names no device.
    """
    entries = visible.entries
    if entries is None:
        return list(devices)
    slurm = visible.source in VISIBILITY_VARIABLES[1:]
    chosen = []
    for entry in entries:
        if entry.isdigit():
            key = "minor_number" if slurm else "nvml_index"
            match = [d for d in devices if d.get(key) == int(entry)]
        else:
            match = [d for d in devices if d["uuid"].startswith(entry)]
        if len(match) != 1:
            break
        chosen.append(match[0])
    return chosen


def slurm_cuda_visible(entries: list[str], devices: list[dict] | None) -> str | None:
    """Pure: what ``CUDA_VISIBLE_DEVICES`` must hold so that a trial gets the GPUs Slurm's variable names.

    ``entries``: ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS``, the node's GPU numbers (or UUIDs).
    ``devices``: what NVML sees here (``nvml_devices``), or None. Returns None to leave
    ``CUDA_VISIBLE_DEVICES`` unset. Under a device cgroup (Slurm's ``ConstrainDevices=yes``) or
    in a container that sees only the job's GPUs, CUDA numbers them from 0, so passing "2,3" on
    would hide every GPU. The rule: UUIDs pass as they are; numbers are resolved to UUIDs
    through the devices' minor numbers; failing that, when as many GPUs are visible as the list
    names, the process sees the job's GPUs already and the numbering is left alone; failing
    that (no NVML, a partial match), the numbers pass as they are, right where nothing renumbers.
    """
    if not entries:
        return ""
    if not all(entry.isdigit() for entry in entries):
        return ",".join(entries)
    if devices is None:
        return ",".join(entries)
    by_minor = {d.get("minor_number"): d["uuid"] for d in devices}
    if all(int(entry) in by_minor for entry in entries):
        return ",".join(by_minor[int(entry)] for entry in entries)
    if len(devices) == len(entries):
        return None
    return ",".join(entries)


def nvml_devices() -> list[dict] | None:
    """Every GPU NVML can open here: index, minor number, UUID, name, memory, driver. None without NVML.

    A GPU NVML lists but cannot open (a device cgroup) is left out. Callers that ask for
    every trial cache it (``node_gpus``).
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no NVIDIA driver here
        return None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                devices.append({
                    "nvml_index": int(pynvml.nvmlDeviceGetIndex(handle)),
                    "minor_number": _minor_number(pynvml, handle),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "total_memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    "driver_version": driver,
                })
            except Exception:  # NVML_ERROR_NO_PERMISSION: another job's GPU behind a cgroup
                continue
        return devices
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


@functools.lru_cache(maxsize=1)
def node_gpus() -> list[dict] | None:
    """``nvml_devices``, asked once per process: the parent starts many trials, and what the driver
    reports does not change while it runs."""
    return nvml_devices()


def _minor_number(pynvml, handle) -> int | None:
    try:
        return int(pynvml.nvmlDeviceGetMinorNumber(handle))
    except Exception:  # not supported (some platforms): Slurm numbers then cannot be resolved by it
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def run_environment(environ: Mapping[str, str], gpus: list[dict] | None) -> dict:
    """The ``environment`` block of a result (see result.RunEnvironment), from this process's environment."""
    visible = visible_devices(environ)
    job = environ.get("SLURM_JOB_ID")
    return {
        "hostname": socket.gethostname(),
        "slurm_job_id": job,
        "slurm_array_task_id": environ.get("SLURM_ARRAY_TASK_ID"),
        "slurm_node": (environ.get("SLURMD_NODENAME") or environ.get("SLURM_NODELIST")) if job else None,
        "cuda_visible_devices": visible.value,
        "visible_devices_source": visible.source,
        "slurm_step_gpus": environ.get("SLURM_STEP_GPUS"),
        "slurm_job_gpus": environ.get("SLURM_JOB_GPUS"),
        "gpus": gpus,
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
