"""The user's source files a probe ran, so that a cached answer is trusted only while they are unchanged.

The cache key covers the factory file, but a factory that does ``import
helper`` (or a model package of its own) depends on files the key cannot
know about: the parent computes the key before any child runs, and never
imports the user's code. So the children say what they ran: at its end, each
trial child (after its forward passes, which may import lazily) and the inspect
child list every module in ``sys.modules`` whose file lies outside the
installed environment (the standard library, site-packages, isoprobe itself,
torch's generated-code caches), with its SHA-256 (``child.sources``). The
parent gathers them from the events (``SourceRecorder``), the entry keeps
them as ``sources``, and a hit re-hashes each one (``changed_source``): one
changed or missing file makes the entry stale. Hashing a few files costs
microseconds, so the hit path stays free of torch and of children.

The children also report the files they read (``child.reads``), which the
parent hashes into the same ``sources``, and a trial its intra-op threads,
which must be the ones the key holds (``cache.threads``). A command trial
reports a folder it read many files of (a dataset that DataLoader workers
read) as the folder (``path/``): its entry is the folder's own listing
(``cache.arguments.folder_listing``, not its subfolders, at most
``READ_FOLDER_ENTRIES`` names and ``READ_FOLDER_STATS`` sizes), and a file
above ``cache.arguments.LARGE_FILE`` bytes is its size and modification time:
the hit re-checks all of it, so none of it may cost seconds.

A path read through a symbolic link comes as the path opened beside its real
one (``child.native_reads``); its entry is where it leads and that file's own
digest (``source_digest``), so a link moved to another target is stale even
where the new target holds the same bytes, and the line says where it led and
leads. The files native code read come in as any read, where the children saw
them; where the trials ran native code of the user's own, what it read itself
may be missing, and the entry says so when stored and on every hit
(``unseen_reads``).

A trial that crashes reports nothing; the modules it ran are the ones its
siblings that finished ran too.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Mapping

from isoprobe.cache.arguments import LARGE_FILE, folder_listing
from isoprobe.errors import ProbeError
from isoprobe.system.files import UntrustedFile, sha256_of

#: A folder a trial read from (a path ending in ``/``) is keyed by its own entries, at most this many names and sizes.
READ_FOLDER_ENTRIES = 5_000
READ_FOLDER_STATS = 500
#: At most this many folders and files read are kept (a trial reports the folders it read the most files of first).
READ_FOLDERS = 4
READ_FILES = 256


def source_digest(path: str, known: dict[str, str | None] | None = None) -> str | None:
    """What an entry's source holds for ``path``: a file's SHA-256 (above ``LARGE_FILE`` bytes, of its size and
    modification time), or, for a folder (``path/``), of its own listing; None when it is not there. A path that is,
    or goes through, a symbolic link (``configs/current/a.yaml`` with ``configs/current -> v1``) holds where it leads
    with that: a link moved to another target is a change, even to a file of the same bytes. ``UntrustedFile`` for
    a file that is not a regular one (a FIFO), OSError when it cannot be read. ``known``: digests already taken of
    real paths in this pass (a link's target is often a source too), filled in here."""
    known = {} if known is None else known
    target = link_target(path)
    real = path if target is None else target
    if real not in known:
        known[real] = _own_digest(real)
    digest = known[real]
    if target is None or digest is None:
        return digest
    return through_link(target, digest)


def link_target(path: str) -> str | None:
    """Where ``path`` leads (its real path, ``/`` kept for a folder) when it is or goes through a symbolic link,
    else None."""
    bare = path[:-1] if path.endswith("/") and len(path) > 1 else path
    real = os.path.realpath(bare)
    if real == bare:
        return None
    return os.path.join(real, "") if path.endswith("/") else real


def through_link(target: str, digest: str) -> str:
    """A linked path's digest: its target's path and the target's own digest."""
    return hashlib.sha256(f"through a symbolic link to {target}: {digest}".encode()).hexdigest()


def _own_digest(path: str) -> str | None:
    if path.endswith("/"):
        if not os.path.isdir(path):
            return None
        listing = folder_listing(path, limit=READ_FOLDER_ENTRIES, stat_limit=READ_FOLDER_STATS, recursive=False)
        return hashlib.sha256(f"folder {listing['listing']}".encode()).hexdigest()
    try:
        status = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(status.st_mode) and status.st_size > LARGE_FILE:
        return hashlib.sha256(f"large file: {status.st_size} bytes, mtime {status.st_mtime_ns}".encode()).hexdigest()
    return sha256_of(path)


def changed_source(sources: Mapping[str, str]) -> str | None:
    """Why the recorded sources no longer hold (the first file that changed), or None when all are as probed."""
    known: dict[str, str | None] = {}
    for path, recorded in sources.items():
        try:
            current = source_digest(path, known)
        except UntrustedFile as exc:
            return f"{path} changed since it was probed ({exc})"
        except OSError as exc:
            return f"{path} changed since it was probed (it cannot be read: {exc.strerror or exc})"
        if current is None:
            return f"{path} changed since it was probed (it no longer exists)"
        if current != recorded:
            return f"{path} changed since it was probed{_link_moved(path, recorded, sources)}"
    return None


def _link_moved(path: str, recorded: str, sources: Mapping[str, str]) -> str:
    """Words on where a linked path led when probed and leads now: its old target is the source whose path and
    digest make the recorded one (the trials report a link's target as a read too); '' when it leads there still."""
    target = link_target(path)
    before = next(
        (other for other, digest in sources.items() if other != path and through_link(other, digest) == recorded), None
    )
    if target is None:
        return f" (it is no longer a symbolic link to {before})" if before else ""
    if before is None:
        return f" (through a symbolic link it leads to {target})"
    return "" if before == target else f" (a symbolic link on its path leads to {target} now, not to {before})"


#: A module file that is native code (a C or C++ extension of the user's own): its reads are invisible.
_NATIVE = re.compile(r"\.(so|pyd|dylib)(\.[0-9.]+)?$")


def unseen_reads(sources: Mapping[str, str]) -> str | None:
    """Where an entry's sources are known to end, in words, or None: native code of the user's ran (an extension
    module of theirs), and what it reads itself no audit hook, wrapper or scan of held files is sure to see
    (``child.native_reads``). Such an entry still answers, but says so."""
    native = sorted(path for path in sources if _NATIVE.search(path))
    if not native:
        return None
    more = f" and {len(native) - 1} more" if len(native) > 1 else ""
    return (
        f"its trials ran native code of yours ({native[0]}{more}), and a file it reads itself may not be among "
        "its sources: after editing one, --refresh"
    )


class SourcesChanged(ProbeError):
    """A file the trials ran (the script, a module of the user's) changed between two trials of one probe: their
    verdicts are of two versions, and an answer from them would be of neither (issue 55)."""


class SourceRecorder:
    """An executor that passes everything to ``inner`` and gathers what its children report for the cache.

    ``sources``: the module files the children hashed, and the files they read
    (``child.reads``), hashed here once each, when first reported (a child's
    time limit never pays for a large file). ``conflicts`` lists files two
    children reported with different digests: the code was edited while the
    probe ran, so its answer is of no one version. ``threads``: the intra-op
    counts the trials ran, which must be the key's (``expected_threads``,
    ``cache.threads``; None where the key holds none, as on CUDA).
    ``unsettled`` says whether the answer may be stored.
    """

    def __init__(self, inner, expected_threads: int | None = None):
        self.inner = inner
        self.expected_threads = expected_threads
        self.sources: dict[str, str] = {}
        self.conflicts: list[str] = []
        self.threads: set[int] = set()
        self._read_sources: set[str] = set()  # the sources that came from reads (bounded: _room_for)

    def _room_for(self, path: str) -> bool:
        """Whether one more read fits the bound a hit re-checks: ``READ_FOLDERS`` folders, ``READ_FILES`` files
        (a file in a folder already listed is in its listing)."""
        if os.path.dirname(path) + "/" in self.sources:
            return False
        kept = sum(p.endswith("/") == path.endswith("/") for p in self._read_sources)
        return kept < (READ_FOLDERS if path.endswith("/") else READ_FILES)

    def prestart(self, conditions) -> None:
        self.inner.prestart(conditions)

    def run(self, request, conditions, *, timeout: float, name: str):
        return self.record(self.inner.run(request, conditions, timeout=timeout, name=name))

    def record(self, run):
        """Take in what ``run``'s events report (also for runs made elsewhere: ``executors.rounds``); ``run``.
        Raises ``SourcesChanged`` when a trial ran a module file another trial ran in another version."""
        for event in run.events:
            for path, digest in (getattr(event, "sources", None) or {}).items():
                if self.sources.setdefault(path, digest) != digest and path not in self.conflicts:
                    self.conflicts.append(path)
                    raise SourcesChanged(f"{path} changed while the probe ran: its trials ran two versions of it")
            for path in getattr(event, "reads", None) or ():
                if path not in self.sources and os.path.isabs(path) and self._room_for(path):
                    try:
                        digest = source_digest(path)
                    except (OSError, ValueError):  # not a regular file now: nothing the answer could depend on
                        continue
                    if digest is not None:
                        self.sources[path] = digest
                        self._read_sources.add(path)
                        if path.endswith("/"):  # its files, hashed from an earlier report, are in its listing
                            for inside in [
                                p for p in self._read_sources if p != path and os.path.dirname(p) + "/" == path
                            ]:
                                self._read_sources.discard(inside)
                                self.sources.pop(inside, None)
            if getattr(event, "threads", None) is not None:
                self.threads.add(event.threads)
        return run

    def changed(self) -> str | None:
        """Why the probe's trials may not all have run one version of the code they ran (a module file, the script:
        one changed between two trials, or since a trial first ran it), or None. Files the trials only *read* are
        not asked here: a script may write what it reads itself (a checkpoint it resumes from, a dataset cache), so
        a change there is the run's own doing; it keeps the answer out of the cache (``unsettled``)."""
        if self.conflicts:
            return f"{self.conflicts[0]} changed while the probe ran"
        code = {path: digest for path, digest in self.sources.items() if path not in self._read_sources}
        if reason := changed_source(code):
            return reason.replace("changed since it was probed", "changed while the probe ran")
        return None

    def unsettled(self) -> str | None:
        """Why the probe's answer must not be stored (a file changed while it ran, the threads are not the key's)."""
        if self.conflicts:
            return f"{self.conflicts[0]} changed while it was probed"
        if self.expected_threads is not None and self.threads - {self.expected_threads}:
            ran = ", ".join(str(n) for n in sorted(self.threads))
            return (
                f"the trials ran {ran} intra-op thread(s), but the cache key holds {self.expected_threads} "
                "(read from OMP_NUM_THREADS, MKL_NUM_THREADS and the usable cores)"
            )
        if reason := changed_source(self.sources):  # read, or hashed, early in the probe: still the same?
            return reason.replace("changed since it was probed", "changed while it was probed")
        return None

    def close(self) -> None:
        self.inner.close()

    @property
    def closed(self) -> bool:
        return bool(getattr(self.inner, "closed", False))
