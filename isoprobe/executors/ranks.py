"""How many ranks a distributed probe runs, decided in the parent before anything else (pure).

Decided before the cache is read, because the world size changes a sharded
strategy's answer and so belongs in the cache key: the resolved number is
written into the spec (``distributed.world_size``), and the key and the probe
both see it. So are the CPU threads each rank runs with (as torchrun starts
ranks), which change a rank's host memory. Where the size came from is
reported (``Result.distributed``).

The real job may be larger than this node (``WORLD_SIZE=16`` on nodes of 8
GPUs). A gang runs on one node, one GPU per rank, so a size taken from the
environment is capped at what the node can run, with a note: each rank of a
smaller gang holds larger shards (zero1, fsdp) or the same (ddp), so the
answer errs on the safe side. A size the spec states is never changed: if the
node cannot run it, that is a spec error (``pipeline.environment``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from isoprobe.executors.srun_plan import Allocation, LauncherChoice, choose_launcher
from isoprobe.spec.job import positive_integer, world_size_from_environment
from isoprobe.spec.model import Spec

#: The CPU backend's gang when nothing says otherwise: the smallest that shows a strategy's cost.
CPU_DEFAULT_WORLD_SIZE = 2
#: The share of the machine's RAM a CPU gang's budgets may add up to.
CPU_RAM_SHARE = 0.8


@dataclass(frozen=True)
class WorldSize:
    size: int
    source: str  # spec, an environment variable, 'visible GPUs', 'cpu default', 'strategy none'
    note: str | None = None


def resolve_launcher(
    spec: Spec,
    environ: Mapping[str, str],
    gpu_count: int,
    *,
    ram_bytes: int,
    cpu_budget: int,
    missing_clients: tuple[str, ...] = (),
) -> LauncherChoice | None:
    """How the gangs are started (``srun_plan.choose_launcher``); None without a strategy. ``LauncherError``: srun
    asked for outside an allocation, or without the Slurm clients ``missing_clients`` names."""
    options = spec.distributed
    if not options.gang:
        return None
    job = _job_world_size(environ)
    wanted = options.world_size or (job[0] if job else 1)
    return choose_launcher(
        options.launcher,
        Allocation.from_environment(environ),
        wanted,
        _node_ranks(gpu_count, ram_bytes, cpu_budget),
        missing_clients,
    )


def _node_ranks(gpu_count: int, ram_bytes: int, cpu_budget: int) -> int:
    """The most ranks a gang runs on this node: one a GPU; on the CPU, what its RAM's share holds at the budget."""
    if gpu_count > 0:
        return gpu_count
    return max(2, int(ram_bytes * CPU_RAM_SHARE) // max(1, cpu_budget))


def resolve_world_size(
    spec: Spec,
    environ: Mapping[str, str],
    gpu_count: int,
    *,
    ram_bytes: int,
    cpu_budget: int,
    across_nodes: bool = False,
) -> WorldSize:
    """The gang's size for ``spec``: the spec's, else the job's (capped to this node), else the node's.

    ``across_nodes``: the gangs are Slurm job steps over the allocation (``launcher`` srun), so the job's size
    is taken as it is, not capped to this node.
    """
    options = spec.distributed
    if not options.gang:
        return WorldSize(1, "strategy none")
    if options.world_size is not None:
        return WorldSize(options.world_size, "spec")
    job = _job_world_size(environ)
    if across_nodes and job is not None:
        return WorldSize(job[0], job[1])
    if gpu_count > 0:
        if job is None:
            return WorldSize(gpu_count, "visible GPUs")
        size, source = job
        if size > gpu_count:
            return WorldSize(
                gpu_count,
                source,
                f"the job has {size} ranks ({source}) but this node has {gpu_count} "
                f"GPU(s): probing {gpu_count} ranks, whose shards are no smaller than the job's",
            )
        return WorldSize(size, source)
    fits_in_ram = _node_ranks(0, ram_bytes, cpu_budget)
    if job is None:
        return WorldSize(min(CPU_DEFAULT_WORLD_SIZE, fits_in_ram), "cpu default")
    size, source = job
    if size > fits_in_ram:
        return WorldSize(
            fits_in_ram,
            source,
            f"the job has {size} ranks ({source}); on the CPU backend "
            f"{fits_in_ram} ranks of the budget fit in this machine's memory: probing {fits_in_ram}",
        )
    return WorldSize(max(2, size), source)


def _job_world_size(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """The launcher's world size if it is more than one rank; also Slurm's GPUs x nodes for a torchrun per node.

    In a pre-job hook before ``srun torchrun --nproc-per-node=G``, Slurm runs
    one task per node, so ``SLURM_NTASKS`` counts nodes, not ranks: a count of
    1 is passed over for ``SLURM_GPUS_ON_NODE`` x ``SLURM_JOB_NUM_NODES``.
    """
    found = world_size_from_environment(environ)
    if found is not None and found[0] > 1:
        return found
    gpus = positive_integer(environ.get("SLURM_GPUS_ON_NODE"))
    nodes = positive_integer(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")) or 1
    if gpus is not None and gpus * nodes > 1:
        return gpus * nodes, "SLURM_GPUS_ON_NODE x SLURM_JOB_NUM_NODES"
    return None


def resolve_threads_per_rank(spec: Spec, environ: Mapping[str, str], world_size: int) -> int | None:
    """The CPU threads each rank runs with, as ``torchrun`` would start it; None: leave OMP_NUM_THREADS as found.

    torchrun sets ``OMP_NUM_THREADS=1`` for every rank when it starts more than
    one process per node and the variable is unset (torch/distributed/run.py),
    and a gang runs all its ranks on one node. The number changes a rank's host
    memory (each intra-op thread its stack and malloc arena), so it is decided
    here, in the parent, and written into the spec: it is in the cache key.
    ``OMP_NUM_THREADS=4,3,2`` (nested levels) gives its first level; a value that
    is not a number is left in the ranks' environment for torch to read, as
    torchrun leaves it.
    """
    options = spec.distributed
    if not options.gang:
        return None
    if options.threads_per_rank is not None:
        return options.threads_per_rank
    inherited = environ.get("OMP_NUM_THREADS")
    if inherited is not None:
        return positive_integer(inherited.split(",")[0])
    return 1 if world_size > 1 else None


def with_world_size(
    spec: Spec, resolved: WorldSize, threads_per_rank: int | None = None, launcher: str | None = None
) -> Spec:
    """``spec`` with the resolved size (and threads per rank, and launcher) written in: what the key and probe see.

    ``threads_per_rank`` None keeps the spec's own (``resolve_threads_per_rank`` returns a stated one as is);
    ``launcher`` None keeps the spec's (the cache key leaves the launcher out: ``cache.store.key_material``).
    """
    options = spec.distributed
    threads = threads_per_rank if threads_per_rank is not None else options.threads_per_rank
    launcher = launcher if launcher is not None else options.launcher
    if not options.gang or (options.world_size, options.threads_per_rank, options.launcher) == (
        resolved.size,
        threads,
        launcher,
    ):
        return spec
    distributed = options.model_copy(
        update={"world_size": resolved.size, "threads_per_rank": threads, "launcher": launcher}
    )
    return spec.model_copy(update={"distributed": distributed})
