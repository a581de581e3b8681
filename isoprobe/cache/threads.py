"""The intra-op threads a CPU trial will run, read in the parent (no torch), for the cache key.

On the CPU backend the thread count moves the answer: every intra-op thread
has its stack and its malloc arena inside the trial's memory cap (measured:
stateful-hog fits 55 at one thread and 50 at two). So an answer found under
``OMP_NUM_THREADS=1`` is not the answer for a run with torch's default, and the
key must tell them apart. The parent never imports torch, so it predicts the
count from what torch (an OpenMP + MKL build, as the wheels are) reads at
start-up, measured here with torch 2.14:

- ``MKL_NUM_THREADS``, else ``OMP_NUM_THREADS``: the leading positive integer
  (``2,1`` reads 2; ``abc`` and ``0`` are ignored);
- a count asked for is capped at the machine's physical cores (``3`` reads 2
  on two cores) unless ``MKL_DYNAMIC`` is false; the CPU affinity does not cap it;
- nothing asked: the physical cores among the CPUs the process may use
  (``taskset -c 0`` reads 1).

The prediction can be wrong for a build or a variable this does not know, so
the key also holds what it was made from (the thread variables as the trial
will see them, the usable CPUs, the cores): the same key means the same inputs.
And the trials report ``torch.get_num_threads()``; an answer whose trials ran
another count than the key's is not cached (``cache.sources.SourceRecorder``).
A mistaken prediction costs a probe, never a wrong answer.

On CUDA the key holds no threads: the answer is the GPU allocator's, which
host threads do not touch, and identical GPUs on nodes with other CPUs share it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

#: The variables that set or cap the thread count (OpenMP's and MKL's), kept in the key as found.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DYNAMIC", "OMP_DYNAMIC", "OMP_THREAD_LIMIT")
_LEADING_INTEGER = re.compile(r"\s*\+?(\d+)")
_CPU_FOLDER = Path("/sys/devices/system/cpu")


def asked_threads(value: str | None) -> int | None:
    """The count a thread variable asks for as torch reads it (``std::stoi``: its leading integer), or None."""
    match = _LEADING_INTEGER.match(value or "")
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


def physical_cores(cpus: list[int]) -> int:
    """How many physical cores ``cpus`` (logical CPU numbers) lie on; the CPU count where sysfs does not say."""
    cores = set()
    for cpu in cpus:
        topology = _CPU_FOLDER / f"cpu{cpu}" / "topology"
        try:
            cores.add(
                ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
            )
        except OSError:
            return len(cpus)
    return max(1, len(cores))


def usable_cpus() -> list[int]:
    """The logical CPUs this process (and so each trial it starts) may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def predicted_threads(variables: Mapping[str, str], usable_cores: int, cores: int) -> int:
    """Pure: ``torch.get_num_threads()`` in a process started with ``variables`` (see the module's docstring).

    ``usable_cores``: the physical cores of the CPUs it may use; ``cores``: the machine's.
    """
    asked = asked_threads(variables.get("MKL_NUM_THREADS")) or asked_threads(variables.get("OMP_NUM_THREADS"))
    if asked is None:
        return usable_cores
    if variables.get("MKL_DYNAMIC", "").strip().lower() in ("false", "0", "no", "off"):
        return asked
    return min(asked, cores)


def trial_threads(environ: Mapping[str, str], threads_per_rank: int | None = None) -> dict:
    """The key's ``threads``: the predicted intra-op count and what it was made from.

    ``threads_per_rank`` is a gang's ``OMP_NUM_THREADS``, set for its ranks at exec (``ranks``).
    """
    variables = {name: environ[name] for name in THREAD_VARIABLES if name in environ}
    if threads_per_rank is not None:
        variables["OMP_NUM_THREADS"] = str(threads_per_rank)
    usable = usable_cpus()
    usable_cores, cores = physical_cores(usable), physical_cores(list(range(os.cpu_count() or 1)))
    return {
        "intra_op": predicted_threads(variables, usable_cores, cores),
        "variables": variables,
        "usable_cpus": len(usable),
        "usable_cores": usable_cores,
        "cores": cores,
    }
