"""What a command's words name, for its cache key: files (hashed) and folders (listed), outside the installed world.

The key is made before any trial runs, from the command alone, so what its words name is keyed directly: the
script, a config file, a launcher script (``./wrapper.sh {batch_size}``, ``bash run.sh``: the executable itself
when it is the user's file, given as a path; a bare name found on PATH, or a path into an environment's ``bin``,
is an installed program), the words of a
``shell: true`` line, and a folder (a dataset: ``--data ./images``), whose edit changes the true edge as much as
an edited script does. What lies in the installed environment (the interpreter, site-packages, a venv's or conda
environment's ``bin``, the system's folders) is not the user's and is never keyed.

Bounded, because this runs on every cache hit, which must stay well under a second:

- a file is keyed by its SHA-256, or, above ``LARGE_FILE`` bytes (a data file: ``--data train.bin``), by its
  size and modification time (a streamed hash of gigabytes would cost the hit seconds);
- a folder is keyed by its listing, walked in sorted order (hidden names and ``__pycache__`` left out): each
  entry's relative name, and the size and modification time of its first ``FOLDER_STATS`` files. A file added,
  removed or renamed anywhere in the first ``FOLDER_ENTRIES`` entries is seen, and so is a file rewritten in place
  among the first ``FOLDER_STATS``; one rewritten past them, or anything past ``FOLDER_ENTRIES``, is not, and the
  key says so (``complete: false``, with how many entries and sizes it covers);
- a word given to an output option (``--output_dir out``, ``--log-dir``, ``--save_path``, ``--checkpoint-dir``:
  ``is_output_option``) is not keyed at all: the command writes there, so a key holding it would change with
  every run and the cache would never answer.

Stdlib only; nothing here raises for a word that names nothing, or something unreadable.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
import sys
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

from isoprobe.system.files import sha256_of

#: Above this many bytes a file in the key is its size and modification time, not its content.
LARGE_FILE = 64 * 1024 * 1024
#: The folders' listings name at most this many entries (files and folders, all folders together), and give the
#: size and modification time of at most ``FOLDER_STATS`` files (one ``stat`` each). Measured on 2 cores shared
#: with other work (load 6-9): a name costs about 4 us, a stat about 16 us; 30,000 files list to these bounds in
#: 65-90 ms (docs/command.md, "The cache").
FOLDER_ENTRIES = 20_000
FOLDER_STATS = 2_000
#: The system's own folders: installed software, never the user's files.
SYSTEM_ROOTS = (
    "/usr/",
    "/bin/",
    "/sbin/",
    "/lib/",
    "/lib32/",
    "/lib64/",
    "/etc/",
    "/proc/",
    "/sys/",
    "/dev/",
    "/run/",
    "/nix/store/",
    "/snap/",
)
#: Words of an option's name that say the command writes there (split on - _ . and case).
_OUTPUT_WORDS = {
    "out",
    "output",
    "outputs",
    "outdir",
    "save",
    "saves",
    "savedir",
    "log",
    "logs",
    "logdir",
    "logging",
    "ckpt",
    "ckpts",
    "checkpoint",
    "checkpoints",
    "tensorboard",
    "wandb",
    "dump",
}
_SHELL_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "{", "}", "!", "exec", "time", "nohup", "env"}


def is_output_option(option: str | None) -> bool:
    """Does this option name a place the command writes (``--output_dir``, ``--log-dir``, ``default_root_dir``)?"""
    if not option:
        return False
    words = set(re.split(r"[-_.]+", option.lstrip("-").lower()))
    return bool(words & _OUTPUT_WORDS) or "default_root" in option.lower()


def command_paths(words: Sequence[str], shell: bool) -> Iterator[tuple[str, str | None, bool]]:
    """``(word, option, executable)`` for each word that may name a file or folder: a value after ``=`` too (its
    option is the part before), ``option`` the option it is given to, ``executable`` where it is run (the first
    word, and after a shell's separators in a ``shell: true`` line)."""
    if shell:
        try:
            lexer = shlex.shlex(words[0], posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = list(lexer)
        except ValueError:  # a line no shell could split: its words are not keyed
            return
    previous: str | None = None
    run_next = True
    for word in words:
        if (shell and word in _SHELL_SEPARATORS) or set(word) <= set(";&|()"):
            run_next, previous = True, None
            continue
        if not word or len(word) > 4096:
            previous, run_next = None, False
            continue
        executable, run_next = run_next, False
        if "=" in word and not executable:
            option, _, value = word.partition("=")
            if word.startswith("-") or re.fullmatch(r"[A-Za-z_][\w.\-]*", option):  # --config=x, data.root=x
                yield word, previous if previous and previous.startswith("-") else None, False
                yield value, option, False
                previous = word
                continue
        if not word.startswith("-"):
            yield word, previous if previous and previous.startswith("-") else None, executable
        previous = word


def argument_material(words: Sequence[str], shell: bool, folder: Path, skip: Sequence[Path] = ()) -> dict:
    """``{"files": {word: digest}, "folders": {word: listing}}`` for what the command's words name outside the
    installed environment; ``skip``: folders never walked into (the cache's own, the trials' scratch)."""
    roots = installed_roots()
    skipped = {os.path.realpath(p) for p in skip}
    files: dict[str, str] = {}
    folders: dict[str, dict] = {}
    entries, stats = FOLDER_ENTRIES, FOLDER_STATS  # shared by every folder the command names
    for word, option, executable in command_paths(words, shell):
        if word in files or word in folders or "{batch_size}" in word or is_output_option(option):
            continue
        path = _locate(word, folder, executable)
        if path is None or _installed(path, roots):
            continue
        try:
            mode = os.stat(path).st_mode
            if stat.S_ISREG(mode):
                files[word] = file_digest(path)
            elif stat.S_ISDIR(mode) and not executable:
                folders[word] = folder_listing(path, skipped, entries, stats)
                entries, stats = entries - folders[word]["entries"], stats - folders[word]["sized"]
        except (OSError, ValueError):  # gone, unreadable, a name the system refuses: nothing to key
            continue
    return {"files": files, "folders": folders}


def _locate(word: str, folder: Path, executable: bool) -> str | None:
    """The absolute path a word names, from the command's folder; None for an executable without a slash, which
    the system looks up on PATH: installed software, never the user's file."""
    if executable and "/" not in word:
        return None  # found on PATH: an installed program (python, torchrun, a module system's tool, a pyenv shim)
    if "\0" in word:
        return None
    path = os.path.join(folder, os.path.expanduser(word))
    return os.path.abspath(path) if os.path.lexists(path) else None


def installed_roots() -> tuple[str, ...]:
    """The installed environment's folders (each ending in a separator): the interpreter's, site-packages,
    isoprobe's own, and the system's."""
    import site
    import sysconfig

    import isoprobe

    paths = sysconfig.get_paths()
    roots = {paths.get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots |= set(getattr(site, "getsitepackages", list)())
    user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    roots.add(user_site if isinstance(user_site, str) else None)
    roots.add(os.path.dirname(os.path.abspath(isoprobe.__file__)))
    found = {os.path.join(os.path.realpath(r), "") for r in roots if r}
    return tuple(sorted(found | set(SYSTEM_ROOTS)))


def _installed(path: str, roots: tuple[str, ...]) -> bool:
    """Is ``path`` installed software: under ``roots`` (as given or as its real path), or in the ``bin`` folder
    of a virtual or conda environment (``python``, ``torchrun``, ``accelerate`` of another environment)?"""
    for candidate in {path, os.path.realpath(path)}:
        if candidate.startswith(roots):
            return True
        parent = os.path.dirname(candidate)
        prefix = os.path.dirname(parent)
        if os.path.basename(parent) in ("bin", "Scripts") and any(
            os.path.exists(os.path.join(prefix, marker)) for marker in ("pyvenv.cfg", "conda-meta")
        ):
            return True
    return False


def file_digest(path: str | Path) -> str:
    """A file's SHA-256, or, above ``LARGE_FILE`` bytes, its size and modification time (as a SHA-256 too: one
    form for the entry's sources). Follows a symbolic link (a dataset file often is one); raises OSError."""
    real = os.path.realpath(path)
    status = os.stat(real)
    if not stat.S_ISREG(status.st_mode):
        raise ValueError(f"{path} is not a regular file")
    if status.st_size > LARGE_FILE:
        return hashlib.sha256(f"large file: {status.st_size} bytes, mtime {status.st_mtime_ns}".encode()).hexdigest()
    return sha256_of(real) or "missing"


def folder_listing(
    path: str | Path,
    skip: AbstractSet[str] = frozenset(),
    limit: int = FOLDER_ENTRIES,
    stat_limit: int = FOLDER_STATS,
    recursive: bool = True,
) -> dict:
    """``{"listing": sha256, "entries": n, "sized": m, "complete": bool}``: a folder's entries, walked in sorted
    order: relative names of the first ``limit``, with the size and modification time of the first ``stat_limit``
    files (a ``stat`` each, the listing's cost). Hidden names and ``__pycache__`` are left out, links to folders
    are listed by their target, never walked, and ``skip``'s folders (and, unless ``recursive``, every subfolder)
    not at all."""
    lines: list[str] = []
    sized = unsized = 0
    stack = [(os.fspath(path), "")]
    complete = True
    while stack and complete:
        where, relative = stack.pop()
        try:
            with os.scandir(where) as entries:
                listed = sorted(entries, key=lambda e: e.name)
        except OSError:
            continue
        below = []
        for entry in listed:
            if entry.name.startswith(".") or entry.name == "__pycache__":
                continue
            if len(lines) >= limit:
                complete = False
                break
            name = f"{relative}{entry.name}"
            try:
                if entry.is_symlink() and entry.is_dir():
                    lines.append(f"{name}/ -> {os.readlink(entry.path)}")
                elif entry.is_dir(follow_symlinks=False):
                    lines.append(f"{name}/")
                    if recursive and os.path.realpath(entry.path) not in skip:
                        below.append((entry.path, f"{name}/"))
                elif sized < stat_limit:
                    status = entry.stat()
                    sized += 1
                    lines.append(f"{name} {status.st_size} {status.st_mtime_ns}")
                else:
                    unsized += 1
                    lines.append(name)
            except OSError:  # gone while listed: its absence is what the listing says
                lines.append(f"{name} ?")
        stack.extend(reversed(below))  # depth first, in sorted order
    digest = hashlib.sha256("\n".join(lines).encode(errors="surrogateescape")).hexdigest()
    return {"listing": digest, "entries": len(lines), "sized": sized, "complete": complete and not unsized}
