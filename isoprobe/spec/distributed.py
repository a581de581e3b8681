"""The spec's ``distributed`` section: the strategy the real job trains with, so the probe answers per rank.

A Slurm job that runs ``srun torchrun ...`` asks for the micro-batch *per rank*,
and what fits per rank depends on the strategy (shared/notes/distributed.md):
DDP adds gradient buckets, ZeRO-1 shards the optimizer state, FSDP shards
parameters, gradients and state and adds all-gather buffers. With a strategy
other than ``none`` every trial is a gang of ``world_size`` rank processes
(``executors.gang``), and the batch the probe reports is the per-rank
micro-batch. Only the options that change memory are here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from isoprobe.spec.base import SpecSection

#: The most ranks one probe starts on one node (a gang is that many processes at once).
MAX_LOCAL_WORLD_SIZE = 64

_DDP_OPTIONS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")
_FSDP_OPTIONS = ("fsdp_wrap", "reshard_after_forward")


class DistributedSpec(SpecSection):
    """How the real job distributes training: the strategy, the ranks, and the options that change memory."""

    strategy: Literal["none", "ddp", "zero1", "fsdp"] = Field(
        "none",
        description=(
            "none: one process. ddp: DistributedDataParallel (full parameters, gradients and optimizer state on "
            "every rank, plus gradient buckets). zero1: DDP with ZeroRedundancyOptimizer (the optimizer state "
            "sharded over the ranks). fsdp: FSDP2 fully_shard (parameters, gradients and state sharded, "
            "all-gathered per block). With a strategy, every trial runs world_size ranks at once and the batch "
            "is the per-rank micro-batch."
        ),
    )
    world_size: int | None = Field(
        None,
        ge=1,
        le=MAX_LOCAL_WORLD_SIZE,
        description=(
            "Ranks in a trial's gang. Unset: WORLD_SIZE (torchrun), else SLURM_NTASKS, else SLURM_GPUS_ON_NODE x "
            "SLURM_JOB_NUM_NODES, else the visible GPUs; on the CPU backend 2. On CUDA each rank takes one "
            "visible GPU, so it can be at most the GPUs on this node. Sharded state per rank shrinks with more "
            "ranks: probing fewer ranks than the real job is conservative for zero1 and fsdp."
        ),
    )
    launcher: Literal["auto", "local", "srun"] = Field(
        "auto",
        description=(
            "How a trial's ranks are started. local: every rank a child process on this node. srun: each trial "
            "one Slurm job step (srun --ntasks=world_size) over the allocation isoprobe runs in, so a gang can "
            "span nodes; needs SLURM_JOB_ID (run isoprobe in the batch script or salloc shell), and the trial "
            "folder (TMPDIR) on a filesystem every node of the allocation sees. auto: srun inside an allocation "
            "of more than one node, or when the ranks wanted are more than this node runs (one a GPU; on the CPU "
            "what 80 % of its RAM holds at the budget); else local. Not in the cache key: the ranks' answer is "
            "the same however they were started."
        ),
    )
    steps_ahead: bool = Field(
        False,
        description=(
            "launcher srun (or auto where it picks srun): start each trial's job step before the trial is due "
            "(the first during the environment "
            "check, each next one beside the running trial, srun --overlap), its ranks importing at idle priority "
            "until their requests are written: the imports (seconds a trial) leave the trial's path where the "
            "nodes have CPU to spare (docs/slurm.md). Off by default: on the two-node test cluster a rank of such "
            "a step, killed by Slurm when its peer ran out of memory, once took over 60 s to end, and Slurm "
            "drained its node (UnkillableStepTimeout); the cause is not found yet. Not in the cache key."
        ),
    )
    threads_per_rank: int | None = Field(
        None,
        ge=1,
        le=4096,
        description=(
            "CPU threads (OMP_NUM_THREADS, torch.set_num_threads) each rank runs with. Unset: as torchrun starts "
            "ranks: the OMP_NUM_THREADS isoprobe was started with, else 1 for a gang of more than one rank "
            "(torchrun sets 1 whenever it starts more than one process per node and the variable is unset). "
            "It changes a rank's host memory: measured on the CPU backend, a DDP rank of tests/data/"
            "stateful-hog.yaml fits 49 a rank with one thread and 43 with two."
        ),
    )
    bucket_cap_mb: float | None = Field(
        None, gt=0, le=65536, description="ddp, zero1: DDP's gradient bucket size in MB (torch's default: 25)."
    )
    gradient_as_bucket_view: bool | None = Field(
        None, description="ddp, zero1: gradients are views into the buckets (saves one gradient copy)."
    )
    static_graph: bool | None = Field(None, description="ddp, zero1: DDP's static_graph.")
    fsdp_wrap: Literal["blocks", "model"] | None = Field(
        None,
        description=(
            "fsdp: 'blocks' (default) shards each block of the model's sequential stages (or lists of blocks) "
            "and then the root, so one block's parameters are gathered at a time; 'model' shards the model as "
            "one unit (everything gathered at once)."
        ),
    )
    reshard_after_forward: bool | None = Field(
        None,
        description="fsdp: free the gathered parameters after each block's forward (default true, as ZeRO-3); "
        "false keeps them until backward (as ZeRO-2: more memory, fewer all-gathers).",
    )

    @model_validator(mode="after")
    def _options_fit_the_strategy(self) -> DistributedSpec:
        if self.strategy == "none":
            if self.world_size not in (None, 1):
                raise ValueError("world_size: needs a strategy (ddp, zero1 or fsdp); with strategy none it is 1")
            if self.launcher != "auto":
                raise ValueError("launcher: needs a strategy (ddp, zero1 or fsdp); one process is never a job step")
            if self.steps_ahead:
                raise ValueError(
                    "steps_ahead: needs a strategy (ddp, zero1 or fsdp) and launcher srun; one process "
                    "is never a job step"
                )
            if self.threads_per_rank is not None:
                raise ValueError(
                    "threads_per_rank: needs a strategy (ddp, zero1 or fsdp); one process uses "
                    "OMP_NUM_THREADS as it finds it"
                )
        if self.steps_ahead and self.launcher == "local":
            raise ValueError(
                "steps_ahead: starts Slurm job steps ahead, and launcher local starts none (its ranks are "
                "forked warm already); remove steps_ahead or set launcher: srun"
            )
        given = [name for name in _DDP_OPTIONS + _FSDP_OPTIONS if getattr(self, name) is not None]
        for name in given:
            owner = ("ddp", "zero1") if name in _DDP_OPTIONS else ("fsdp",)
            if self.strategy not in owner:
                raise ValueError(
                    f"{name}: applies to strategy {' or '.join(owner)}, not {self.strategy}; remove it or change "
                    "the strategy"
                )
        return self

    @property
    def gang(self) -> bool:
        """Whether a trial is a gang of ranks (a strategy other than none)."""
        return self.strategy != "none"
