"""A process's memory as /proc tells it: the one reader of ``/proc/PID/status`` and of the writable shared mappings.

Standard library only, importing nothing of isoprobe's: the trial's own readings (``child.core.memory``,
``child.own_modules``) import it, and the command trial's shim (``child/shim/_isoprobe_shim.py``, which imports
nothing of isoprobe) loads this file by path, in the user's process.
"""


def status_bytes(*keys, pid="self"):
    """VmHWM, VmRSS, VmData, RssFile... from ``/proc/PID/status``, in bytes (None where absent or unreadable)."""
    values = dict.fromkeys(keys)
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name, _, rest = line.partition(":")
                if name in values:
                    values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return values


def shared_writable_bytes(maps=None):
    """The size of this process's writable shared mappings (``rw-s`` in /proc/self/maps), in bytes.

    These are the mappings RLIMIT_DATA does not count but a model can fill:
    anonymous shared memory (``/dev/zero (deleted)``), memfd and /dev/shm
    files, SysV segments. Read-only shared mappings (locale caches and the like)
    cannot be filled by the process and are left out. ``maps`` is the file's text,
    for tests; 0 where it cannot be read.
    """
    if maps is None:
        try:
            with open("/proc/self/maps") as file:
                maps = file.read()
        except OSError:
            return 0
    total = 0
    for line in maps.splitlines():
        fields = line.split(maxsplit=2)
        if len(fields) < 2 or len(fields[1]) != 4 or fields[1][1] != "w" or fields[1][3] != "s":
            continue
        start, _, end = fields[0].partition("-")
        try:
            total += int(end, 16) - int(start, 16)
        except ValueError:
            continue
    return total
