"""The files a child opens for reading, so that a cached answer is trusted only while they are unchanged.

A factory may read more than its modules: a JSON of layer sizes, a YAML of
hyperparameters, a tokenizer's vocabulary. Edit one, and the model (and so its
largest batch) changes while every module file stays the same. The key cannot
know these files (the parent never runs the user's code), so the children
watch: ``watch_reads`` installs an audit hook (``sys.addaudithook``) that notes
every ``open`` event (``open()``, ``io.open_code``, ``os.open``, and what is
built on them: ``json.load(open(...))``, ``Path.read_text``, ``torch.load``,
``np.load``), and ``files_read`` lists, at the child's end, the regular files
it opened for reading and never for writing, outside the installed environment
(``child.sources.environment_roots``), the kernel's folders and the bytecode
caches. The child reports paths only; the parent hashes each one once
(``cache.sources.SourceRecorder``), so a large file costs the parent a streamed
read per probe and per cache hit, never a trial its timeout.

What the hook cannot see, ``child.native_reads`` partly makes up for: the
calls of native readers' Python entry points (``torch.from_file``,
``safetensors.safe_open``, ``tokenizers.Tokenizer.from_file``) are noted as
opens, and the files still memory-mapped or open for reading at the child's
end are added. A path through a symbolic link is reported as opened too (the
parent keys it with where it leads). A file C or Rust code read and closed on
its own is named in the spec, ``model.depends_on``, which the key hashes directly.

A file the child wrote is its output, not its input (a log, a cache it fills),
so it is left out, as are files gone by the child's end. Stdlib only: the
children import this before the user's code runs; the hook never raises.
"""

from __future__ import annotations

import os
import stat
import sys

from isoprobe.child import native_reads

#: The kernel's and the devices' folders: never the user's inputs, and reading some of them never ends.
SYSTEM_FOLDERS = ("/proc/", "/sys/", "/dev/", "/run/")

_reads: set[str] | None = None
_writes: set[str] = set()


def watch_reads() -> None:
    """Start noting the files this process opens (once per process: an audit hook cannot be removed)."""
    global _reads
    if _reads is None:
        _reads = set()
        sys.addaudithook(_hook)
        native_reads.watch(_hook)  # torch.from_file, safetensors, tokenizers: their calls noted as opens


def _hook(event: str, args: tuple) -> None:
    if event != "open" or _reads is None:
        return
    try:  # an exception here would fail the user's open(): never let one out
        path, mode, flags = args
        if path is None or isinstance(path, int):  # a descriptor: its file was opened (and seen) before
            return
        path = os.path.abspath(os.fsdecode(os.fspath(path)))
        reads, writes = access(mode, flags)
        if writes:
            _writes.add(path)
        if reads:
            _reads.add(path)
    except Exception:
        pass


def access(mode: str | None, flags: int) -> tuple[bool, bool]:
    """(reads, writes) of an ``open`` audit event: ``open()`` gives its mode, ``os.open`` None and its flags."""
    if isinstance(mode, str):
        return "r" in mode or "+" in mode, any(c in mode for c in "wax+")
    access_mode = flags & os.O_ACCMODE
    writes = access_mode != os.O_RDONLY or bool(flags & (os.O_CREAT | os.O_TRUNC))
    return access_mode in (os.O_RDONLY, os.O_RDWR), writes


def files_read(roots: tuple[str, ...] | None = None) -> list[str]:
    """Real paths of the regular files opened for reading and never for writing, outside ``roots`` and the system,
    and the path as opened where it was, or went through, a symbolic link (``configs/current/a.yaml``): the parent
    keys that path with where it leads (``cache.sources.source_digest``), so a link moved elsewhere is a new probe.

    ``roots`` defaults to the installed environment (``child.sources.environment_roots``) and torch's
    download cache (``$TORCH_HOME``: its files are named by their own hashes).
    """
    if _reads is None:
        return []
    _reads.update(native_reads.held_files(lambda path: True))  # what native code still holds mapped or open
    if roots is None:
        from isoprobe.child.sources import environment_roots

        torch_home = os.environ.get("TORCH_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch"
        )
        roots = (*environment_roots(), os.path.join(os.path.realpath(torch_home), ""))
    written = {os.path.realpath(path) for path in list(_writes)}
    found = set()
    for path in list(_reads):
        real = os.path.realpath(path)
        if real in written or not _users(real, roots):
            continue
        try:
            if stat.S_ISREG(os.stat(real).st_mode):
                found.add(real)
                if path != real and _users(path, roots):  # a link on its way: its own path too, keyed with its target
                    found.add(path)
        except OSError:  # gone, or unreadable now: nothing the next run could read either
            continue
    return sorted(found)


def _users(path: str, roots: tuple[str, ...]) -> bool:
    return not (path.startswith(SYSTEM_FOLDERS) or path.startswith(roots) or "__pycache__" in path.split(os.sep))
