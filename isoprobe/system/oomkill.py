"""The kernel's own record of OOM kills, to tell an OOM-killer SIGKILL from any other.

A trial killed by the kernel's OOM killer (or a memory cgroup's limit) dies of
SIGKILL with no message, exactly like a trial killed by anything else. The
memory cgroup counts its OOM kills (cgroup v2: ``memory.events``, v1:
``memory.oom_control``, line ``oom_kill N``). The local executor reads the counter
of the cgroup the child runs in before and after the trial: a SIGKILL during
which the counter moved is classified as out of memory, with that evidence in
the result. Where no counter can be read, a SIGKILL stays 'crashed'.
"""

from __future__ import annotations

from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def memory_cgroup_dir(pid: int | str = "self", root: Path = _CGROUP_ROOT) -> Path | None:
    """The directory of the memory cgroup ``pid`` is in (v1 'memory' controller, else the v2 unified one)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidate = root / "memory" / path.lstrip("/")
            if candidate.is_dir():
                return candidate
        if controllers == "":
            unified = root / path.lstrip("/")
    return unified if unified is not None and (unified / "memory.events").exists() else None


def oom_kill_count(cgroup: Path | None) -> int | None:
    """The cgroup's OOM-kill counter, or None when it cannot be read."""
    if cgroup is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (cgroup / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return None
