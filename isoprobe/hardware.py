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

    None where NVML cannot answer (library or driver missing). Entries of the
    visible list are driver indices or UUIDs (``GPU-...``, ``MIG-...``); like CUDA,
    the list ends at the first entry that names no device. With no restriction
    the order is NVML's (PCI bus order), which is CUDA's with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and on every node whose GPUs are all alike.
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
        entries = visible.entries
        if entries is None:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        else:
            handles = []
            for entry in entries:
                try:
                    if entry.isdigit():
                        handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(entry)))
                    else:
                        handles.append(pynvml.nvmlDeviceGetHandleByUUID(entry))
                except Exception:
                    break
        return [
            {
                "nvml_index": int(pynvml.nvmlDeviceGetIndex(handle)),
                "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "total_memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                "driver_version": driver,
            }
            for handle in handles
        ]
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


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
