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

The parent names the trials' GPUs only where it can know them (:func:`unresolved_reason`): a number in
``CUDA_VISIBLE_DEVICES`` is CUDA's index in ``CUDA_DEVICE_ORDER``'s order (fastest first unless the user chose
``PCI_BUS_ID``), NVML's is the PCI bus's, and the trials keep the user's order; with MIG enabled CUDA enumerates
MIG instances, which only their ``MIG-`` UUIDs name (NVIDIA's MIG user guide, "CUDA Device Enumeration").
"""

from __future__ import annotations

import functools
import os
import platform
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

#: In order of precedence; the first one set decides.
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")


@dataclass(frozen=True)
class Visible:
    """The GPUs the trials may use: ``value`` as CUDA_VISIBLE_DEVICES would hold it, or None for all."""

    value: str | None
    source: str  # one of VISIBILITY_VARIABLES, or "none"
    #: ``CUDA_DEVICE_ORDER`` as the trials get it (the user's; None: CUDA's default, FASTEST_FIRST).
    order: str | None = None

    @property
    def pci_order(self) -> bool:
        """Do CUDA's indices follow the PCI bus (NVML's order)?"""
        return (self.order or "").strip().upper() == "PCI_BUS_ID"

    @property
    def entries(self) -> list[str] | None:
        if self.value is None:
            return None
        return [entry.strip() for entry in self.value.split(",") if entry.strip()]


def visible_devices(environ: Mapping[str, str]) -> Visible:
    """Pure: which GPUs a process started with ``environ`` may use, which variable said so, and CUDA's order."""
    order = environ.get("CUDA_DEVICE_ORDER")
    if "CUDA_VISIBLE_DEVICES" in environ:
        return Visible(environ["CUDA_VISIBLE_DEVICES"].strip(), "CUDA_VISIBLE_DEVICES", order)
    for name in VISIBILITY_VARIABLES[1:]:
        value = environ.get(name, "").strip()
        if value:
            return Visible(value, name, order)
    return Visible(None, "none", order)


def nvml_gpus(visible: Visible) -> list[dict] | None:
    """The visible GPUs in CUDA's order, each ``{nvml_index, uuid, name, total_memory_bytes, driver_version}``.

    None where NVML cannot answer (library or driver missing), or where it cannot tell which GPU or MIG
    instance the trials' CUDA will use (``unresolved_reason``): no facts rather than another GPU's. Which devices
    the visible list names is ``select_visible``'s rule; a MIG instance is listed with its own UUID, name and
    memory, and its parent's index.
    """
    gpus, _ = visible_gpus(visible)
    if gpus is None:
        return None
    return [{k: d[k] for k in ("nvml_index", "uuid", "name", "total_memory_bytes", "driver_version")} for d in gpus]


def visible_gpus(
    visible: Visible, devices: list[dict] | Literal[True] | None = True
) -> tuple[list[dict] | None, str | None]:
    """The visible GPUs with all of ``nvml_devices``' facts (free memory too), or None and why not.

    ``devices``: NVML's devices, or True to read them here."""
    if devices is True:
        devices = nvml_devices()
    if devices is None:
        return None, "NVML cannot be read here (no library or no driver)"
    reason = unresolved_reason(devices, visible)
    if reason is not None:
        return None, reason
    return select_visible(devices, visible), None


def unresolved_reason(devices: list[dict], visible: Visible) -> str | None:
    """Pure: why the parent cannot tell which GPUs (or MIG instances) the trials' CUDA uses, or None if it can.

    What is judged is what a trial's CUDA gets: Slurm's numbers become what ``slurm_cuda_visible`` passes on.
    - MIG: where a GPU has MIG mode enabled, CUDA enumerates its MIG instances, and only their ``MIG-`` UUIDs
      name one; unset, a number or a parent's ``GPU-`` UUID leaves the choice of instance to CUDA (the first
      available, or one per GPU instance, by driver release), so no parent's facts are the trial's.
    - Order: a number is CUDA's index in ``CUDA_DEVICE_ORDER``'s order, fastest first by default ("a simple
      heuristic", the CUDA programming guide); NVML counts by PCI bus. Unless the user set ``PCI_BUS_ID``, a
      number (or the whole list, unset) is trusted only where every GPU here has one name and size: then any
      of them has the facts of the one CUDA picks.
    """
    entries = visible.entries
    if visible.source in VISIBILITY_VARIABLES[1:] and entries is not None:
        passed = slurm_cuda_visible(entries, devices)
        entries = None if passed is None else [entry for entry in passed.split(",") if entry]
    if entries == []:
        return None
    named = "unset" if entries is None else ",".join(entries)
    mig = [d for d in devices if d.get("mig_enabled")]
    if mig:
        mig_parents = tuple(d["uuid"] for d in mig)
        if entries is None or any(
            entry.isdigit() or entry.startswith(mig_parents) or any(parent.startswith(entry) for parent in mig_parents)
            for entry in entries
        ):
            return (
                f"MIG is enabled on {', '.join(d['uuid'] for d in mig)} and CUDA_VISIBLE_DEVICES ({named}) does "
                "not name a MIG instance by its MIG- UUID: CUDA picks the instance, and which one (its size) "
                "cannot be told without CUDA; name the instance (nvidia-smi -L lists the MIG- UUIDs)"
            )
    if visible.pci_order or not (entries is None or any(entry.isdigit() for entry in entries)):
        return None
    kinds = {(d.get("name"), d.get("total_memory_bytes")) for d in devices}
    if len(kinds) <= 1:
        return None
    return (
        f"CUDA_VISIBLE_DEVICES ({named}) names GPUs by number on a node with GPUs of different kinds, and "
        f"CUDA_DEVICE_ORDER is {visible.order or 'unset (FASTEST_FIRST)'}: CUDA's numbers then need not be "
        "NVML's (PCI order), so which GPU is which cannot be told without CUDA; set CUDA_DEVICE_ORDER=PCI_BUS_ID "
        "for your job too, or name the GPUs by UUID"
    )


def select_visible(devices: list[dict], visible: Visible) -> list[dict]:
    """Pure: the devices (``nvml_devices``' entries) that ``visible`` names, in its order.

    An entry is a UUID or a prefix of one (``GPU-...``, ``MIG-...``; CUDA accepts a unique
    prefix, NVML's lookup does not), or a number. A ``MIG-`` UUID names a MIG instance: its entry
    is its parent's with the instance's UUID, name and memory. A number in ``CUDA_VISIBLE_DEVICES`` is
    CUDA's index, which is NVML's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (whether it can be trusted
    otherwise is ``unresolved_reason``'s question); a number from
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
        elif entry.startswith("MIG-"):
            match = [
                _mig_entry(d, instance)
                for d in devices
                for instance in d.get("mig_devices", ())
                if instance["uuid"].startswith(entry)
            ]
        else:
            match = [d for d in devices if d["uuid"].startswith(entry)]
        if len(match) != 1:
            break
        chosen.append(match[0])
    return chosen


def _mig_entry(parent: dict, instance: dict) -> dict:
    """A MIG instance as ``select_visible`` lists it: its parent's index and driver, its own UUID, name and memory."""
    return {
        **{k: v for k, v in parent.items() if k not in ("mig_enabled", "mig_devices")},
        **instance,
        "mig_instance": True,
    }


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
    On a node where a GPU has MIG mode enabled the numbers pass as they are too: a parent's ``GPU-`` UUID
    would leave CUDA to pick among its MIG instances (or hide them), and Slurm's ``MIG-`` UUIDs pass anyway.
    """
    if not entries:
        return ""
    if not all(entry.isdigit() for entry in entries):
        return ",".join(entries)
    if devices is None or any(d.get("mig_enabled") for d in devices):
        return ",".join(entries)
    by_minor = {d.get("minor_number"): d["uuid"] for d in devices}
    if all(int(entry) in by_minor for entry in entries):
        return ",".join(by_minor[int(entry)] for entry in entries)
    if len(devices) == len(entries):
        return None
    return ",".join(entries)


def nvml_devices() -> list[dict] | None:
    """Every GPU NVML can open here: index, minor number, UUID, name, memory (total and free), driver, and MIG:
    ``mig_enabled`` and ``mig_devices`` (each instance's ``uuid``, ``name``, ``total_memory_bytes``,
    ``free_memory_bytes``). None without NVML.

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
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                name = _text(pynvml.nvmlDeviceGetName(handle))
                mig = _mig_enabled(pynvml, handle)
                devices.append(
                    {
                        "nvml_index": int(pynvml.nvmlDeviceGetIndex(handle)),
                        "minor_number": _minor_number(pynvml, handle),
                        "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                        "name": name,
                        "total_memory_bytes": int(memory.total),
                        "free_memory_bytes": _free(memory),
                        "driver_version": driver,
                        "mig_enabled": mig,
                        "mig_devices": _mig_devices(pynvml, handle, name) if mig else [],
                    }
                )
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


def _free(memory) -> int | None:
    free = getattr(memory, "free", None)
    return None if free is None else int(free)


def _mig_enabled(pynvml, handle) -> bool:
    """MIG mode is on now (the current mode; a pending one takes effect at the GPU's next reset)."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # NVML_ERROR_NOT_SUPPORTED (a GPU without MIG), an old pynvml without the call
        return False
    return current == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1)


def _mig_devices(pynvml, handle, parent_name: str) -> list[dict]:
    """The MIG instances of a GPU in MIG mode: UUID (``MIG-...``), name (the profile's, e.g. ``... MIG 1g.10gb``,
    where the driver gives one), memory. Empty slots of the ``nvmlDeviceGetMaxMigDeviceCount`` are skipped."""
    instances: list[dict] = []
    try:
        slots = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception:
        return instances
    for slot in range(slots):
        try:
            instance = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            memory = pynvml.nvmlDeviceGetMemoryInfo(instance)
            try:
                name = _text(pynvml.nvmlDeviceGetName(instance))
            except Exception:
                name = f"{parent_name} MIG"
            instances.append(
                {
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(instance)),
                    "name": name,
                    "total_memory_bytes": int(memory.total),
                    "free_memory_bytes": _free(memory),
                }
            )
        except Exception:  # NVML_ERROR_NOT_FOUND: no instance in this slot
            continue
    return instances


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
