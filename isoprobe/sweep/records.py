"""Which cache entry answered a spec on a Slurm target: how a sweep run again submits nothing.

The cache key holds the device's facts: on a GPU node, the GPUs' model, memory
and driver from NVML; on the CPU backend, the CPU's name and the RAM. A login
node has none of a GPU partition's facts (often no GPU at all), and its CPU
need not be the compute nodes' CPU, so it cannot compute the key a task will
use. Instead each task, having answered, records the key it used under a
*record key* that the login node can compute: the same material as the cache
key (spec with overrides, the user's code, package and Python versions,
isoprobe's version, the allocator settings) with the device's facts replaced
by the target's name (``partition=a100``). A sweep reads the record, then the
entry it names, and believes the entry only as a cache hit would
(``cache.trust.distrust`` and ``cache.sources.changed_source``).

What this trusts: that a target is one GPU type (a partition or a constraint
that names one model) and that the nodes run the same software as the login
node (a shared virtual environment; a different torch is a different record
key, so it probes). When a partition's hardware changes, ``--refresh`` probes
again and replaces both the entry and the record.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from isoprobe.report.result import Result
    from isoprobe.spec.model import Spec
    from isoprobe.sweep.model import SweepItem

#: The records live next to the entries, in a folder of their own.
RECORDS_FOLDER = "sweep-records"
RECORD_LIMIT = 64 * 1024


class SweepRecord(BaseModel):
    """A task's note: this spec on this target was answered by the cache entry ``cache_key``."""

    model_config = ConfigDict(extra="forbid")

    cache_key: str = Field(description="The key of the entry that holds the answer (its file is KEY.json).")
    target: str = Field(description="The Slurm target the task ran on: 'partition=NAME' or 'constraint=FEATURE'.")
    spec: str = Field(description="The spec's absolute path the task read.")
    node: str | None = Field(None, description="The node the task ran on (SLURMD_NODENAME), for people.")


def record_key(item: SweepItem, spec: Spec) -> str:
    """The key a login node and a compute node both compute: the cache key's material, device facts out, target in."""
    from isoprobe.cache.store import cache_key, key_material

    environ = dict(os.environ)
    material = key_material(spec, item.spec, environ, None)
    material["device"] = {
        "sweep_target": item.target,
        "requested": spec.device,
        "allocator_environment": {
            name: environ[name] for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if name in environ
        },
    }
    return cache_key(material)


def record_path(cache_dir: str | Path, key: str) -> Path:
    return Path(cache_dir) / RECORDS_FOLDER / f"{key}.json"


def write_record(item: SweepItem, spec: Spec, cache_key: str) -> Path | None:
    """Record (atomically) that ``cache_key`` answered ``item`` on its target; None for a local sweep."""
    if item.target == "local":  # a local sweep reads the cache by its exact key: no record needed
        return None
    path = record_path(item.cache_dir, record_key(item, spec))
    path.parent.mkdir(parents=True, exist_ok=True)
    record = SweepRecord(
        cache_key=cache_key, target=item.target, spec=item.spec, node=os.environ.get("SLURMD_NODENAME")
    )
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(record.model_dump_json())
    os.chmod(temporary, 0o644)  # read by other users' sweeps, as the entries are
    os.replace(temporary, path)
    return path


def recorded_result(item: SweepItem, spec: Spec) -> tuple[Result | None, str | None]:
    """The trusted cached ``Result`` a task recorded for ``item`` (as a hit), or (None, why not) to probe."""
    from pydantic import ValidationError

    from isoprobe.cache.sources import changed_source
    from isoprobe.cache.store import ResultCache
    from isoprobe.cache.trust import distrust
    from isoprobe.report.result import CacheInfo, Result
    from isoprobe.system.files import UntrustedFile, read_bounded

    path = record_path(item.cache_dir, record_key(item, spec))
    try:
        data = read_bounded(path, RECORD_LIMIT)
        if data is None:
            return None, None
        record = SweepRecord.model_validate_json(data)
        cache = ResultCache(Path(item.cache_dir))
        text = cache.read(record.cache_key)
        if text is None:
            return None, f"the record {path} names an entry that is gone"
        stored = Result.model_validate_json(text)
    except (UntrustedFile, ValidationError, ValueError, OSError) as exc:
        return None, f"the record {path} cannot be used ({type(exc).__name__})"
    if stored.spec is None:  # a stop's document (bad_spec) is never stored: an entry without a spec is not one
        return None, "the recorded entry is not used: it holds no spec"
    expected = spec
    if spec.distributed.gang and spec.distributed.world_size is None:  # the task resolved the size on its node
        expected = spec.model_copy(update={"distributed": stored.spec.distributed})
    if reason := distrust(stored, key=record.cache_key, spec=expected) or changed_source(stored.sources or {}):
        return None, f"the recorded entry is not used: {reason}"
    entry = cache.entry(record.cache_key)
    stored_at = stored.cache.stored_at if stored.cache is not None else None  # distrust refuses an entry without
    return stored.model_copy(
        update={
            "spec_path": item.spec,
            "cache": CacheInfo(hit=True, key=record.cache_key, path=str(entry), stored_at=stored_at),
        }
    ), None
