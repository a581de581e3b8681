"""Where the trials ran: the device and its capacity, the allocator, the host and its GPUs, the gang of ranks.

The facts of the run's environment, recorded before and around the trials (``pipeline.environment``
and the answer fill them in); they bound the answer but are not part of it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from isoprobe.report.strict import Strict


class DeviceInfo(Strict):
    """Where the trials ran, and the memory they were allowed."""

    backend: Literal["cpu", "cuda"]
    requested: str = Field(description="The spec's device (auto, cpu, cuda, cuda:N) after command-line overrides.")
    name: str = Field(description="GPU name, or the CPU model for the CPU backend.")
    index: int | None = Field(None, description="CUDA device index within CUDA_VISIBLE_DEVICES.")
    total_memory_bytes: int = Field(description="GPU memory, or the machine's RAM on the CPU backend.")
    memory_budget_bytes: int | None = Field(None, description="The cap applied to each trial, if any.")
    budget_source: Literal["spec", "command line", "default"] | None = None
    capacity_bytes: int = Field(description="What the peaks are compared with: the budget if set, else total memory.")
    import_baseline_bytes: int | None = Field(
        None,
        description=(
            "CPU: memory the child holds after importing torch and building nothing (data segment), "
            "which is part of the budget."
        ),
    )
    note: str | None = Field(None, description="How this device was chosen, when it was not asked for explicitly.")


class AllocatorInfo(Strict):
    """The allocator configuration every trial ran with."""

    value: str | None = Field(description="The PYTORCH_CUDA_ALLOC_CONF string, or null for torch's default.")
    source: Literal["spec", "environment", "none"]
    variables: list[str] = Field(description="Environment variables set to this value in each child.")
    applies: bool = Field(description="False on the CPU backend, where the CUDA allocator is not used.")


class GpuFacts(Strict):
    """One GPU as NVML (the driver) describes it, read without creating a CUDA context."""

    nvml_index: int = Field(description="The driver's index (nvidia-smi's), which CUDA_VISIBLE_DEVICES refers to.")
    uuid: str
    name: str
    total_memory_bytes: int
    driver_version: str | None = None


class RunEnvironment(Strict):
    """Where and for which job this run happened: the scheduler's facts, not part of the answer."""

    hostname: str
    slurm_job_id: str | None = Field(None, description="SLURM_JOB_ID (with SLURM_ARRAY_JOB_ID/TASK_ID for arrays).")
    slurm_array_task_id: str | None = None
    slurm_node: str | None = Field(None, description="SLURMD_NODENAME, else SLURM_NODELIST.")
    cuda_visible_devices: str | None = Field(
        None, description="The GPUs the trials may use, as CUDA_VISIBLE_DEVICES gives them to the children."
    )
    visible_devices_source: Literal["CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "none"] = Field(
        "none", description="Where cuda_visible_devices came from: Slurm's GPU variables count when CUDA's is unset."
    )
    slurm_step_gpus: str | None = None
    slurm_job_gpus: str | None = None
    gpus: list[GpuFacts] | None = Field(
        None, description="The visible GPUs in CUDA's order, from NVML; null where NVML is not available."
    )


class DistributedInfo(Strict):
    """The strategy the trials ran, as gangs of ranks: every batch in this result is per rank."""

    strategy: Literal["ddp", "zero1", "fsdp"]
    world_size: int = Field(description="Ranks in each trial's gang.")
    world_size_source: str = Field(
        description="spec, the environment variable it came from, 'visible GPUs' or 'cpu default'."
    )
    backend: Literal["gloo", "nccl"] = Field(description="The collectives' backend: nccl on CUDA, gloo on the CPU.")
    threads_per_rank: int | None = Field(
        None,
        description="The CPU threads (OMP_NUM_THREADS) each rank ran with, as torchrun would start it "
        "(distributed.threads_per_rank); null: the ranks kept the environment's setting, unreadable here.",
    )
    per_rank: Literal[True] = Field(
        True, description="max_batch_size, recommended_batch_size and every trial's batch are per-rank micro-batches."
    )
    launcher: Literal["local", "srun"] = Field(
        "local",
        description="How each trial's ranks were started: local child processes on this node, or one "
        "Slurm job step per trial over the allocation (distributed.launcher, resolved).",
    )
    nodes: list[str] = Field(
        default_factory=list,
        description="srun: the nodes the trials' ranks ran on, in rank order of first "
        "appearance (each rank's own is trials[].ranks[].node); empty for a local gang.",
    )
