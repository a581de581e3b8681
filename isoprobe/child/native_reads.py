"""What the audit hook on ``open`` misses of the files a process reads: the path through a symbolic link, and
the files native code reads. Shared by a command's shim (``shim/_isoprobe_shim.py`` loads this file by path) and
isoprobe's own children (``child.reads``); standard library only, and nothing here may raise into the process.

**A symbolic link.** A read is reported as the file's real path and, where the path as opened is or goes through a
link (``configs/current/a.yaml`` with ``configs/current -> v1``), as that path too (``read_paths``): the parent keys
it with where it leads (``cache.sources.source_digest``), so a link moved to another target is a new probe.

**Native code.** The hook sees every ``open`` made through Python: ``open()``, ``io.open``, ``os.open`` and what is
built on them, ``np.fromfile``, ``np.memmap``, ``np.load``, ``torch.load`` with or without ``mmap=True`` (each
checked, torch 2.14, numpy 2.4). C, C++ and Rust code that opens a file itself raises no audit event. Two ways in:

- **The Python entry points of native readers**, wrapped where they are looked up, so that each call notes its path
  as an ``open`` (``watch``): ``torch.from_file``, ``torch.UntypedStorage.from_file`` (``TypedStorage.from_file``
  calls it) and ``torch.jit.load`` of a path (C++ reads all three); ``safetensors.safe_open`` (Rust: what
  ``safetensors.torch.load_file`` and transformers call) and ``tokenizers.Tokenizer.from_file`` (Rust: a fast
  tokenizer's ``tokenizer.json``). Each is wrapped when its module is in: at once if it is, else when it is
  imported (a finder in front of the import system, gone once all are in), so a later ``from safetensors import
  safe_open`` binds the wrapper. A name bound to an original before that is not seen.
- **What the process holds** (``held_files``): the files it has memory-mapped other than as code (a C++ ``mmap``:
  a pyarrow dataset, an LMDB, a tensor of ``from_file`` still alive) and those it has open for reading only (an
  HDF5 file h5py keeps open), from ``/proc/self/maps`` and ``/proc/self/fd``: a command's processes at their steps
  1, 2, 4, 8..., isoprobe's own children at their end. Left out: the system's folders, hidden folders (a tool's
  cache: ``~/.nv``, ``~/.cache``), files deleted, and writable shared mappings (the process's output).

What neither sees: a file native code read and closed before it was looked for, through no entry point above (a C
extension's own ``fopen``, a C++ parquet or image reader). The cache says so (docs/cache-and-security.md).
"""

import os
import sys

#: The modules whose native readers are wrapped (``_wrap``).
_READERS = ("torch", "safetensors", "tokenizers")
#: Never the user's inputs: the system's folders (``isoprobe.cache.arguments.SYSTEM_ROOTS``, and ``/var/``).
_SYSTEM = (
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
    "/var/",
)
#: The trial's folder, as given and as its real path (each read is checked against both).
_trial_dirs: "dict[str, tuple[str, ...]]" = {}


def read_paths(path, outside, trial_dir):
    """What a read of ``path`` (absolute, as opened) is reported as: its real path, and ``path`` itself where a
    symbolic link is on its way; each ``outside`` the installed environment, never bytecode or the trial's own."""
    real = os.path.realpath(path)
    own = _trial_dirs.get(trial_dir)
    if own is None:
        own = _trial_dirs[trial_dir] = tuple(
            {os.path.join(os.path.abspath(trial_dir), ""), os.path.join(os.path.realpath(trial_dir), "")}
        )
    found = {p for p in {real, path} if outside(p) and "__pycache__" not in p and not p.startswith(own)}
    return found if real in found else set()


def step_reads(reads, step, note, outside, trial_dir):
    """All the paths the reads so far are reported as; at steps 1, 2, 4, 8... the files native code holds mapped
    or open are added to ``reads`` first (at step 1, torch's entry points are wrapped if they were not yet)."""
    if step & (step - 1) == 0:
        try:
            if step == 1:
                watch(note)
            reads.update(held_files(lambda p: outside(p) and p not in reads))
        except Exception:
            pass
    return set().union(*(read_paths(path, outside, trial_dir) for path in list(reads)))


def watch(note):
    """Wrap the native readers' entry points: now for the modules already in (torch, in a command's process, whose
    optimizers loaded the shim), the others when they are imported. ``note(event, args)`` records a read: the
    caller's audit hook, called as for an ``open`` event."""
    try:
        waiting = []
        for name in _READERS:
            if name in sys.modules:
                _wrap(name, sys.modules[name], note)
            else:
                waiting.append(name)
        if waiting and not any(isinstance(f, _NativeReaderFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _NativeReaderFinder(waiting, note))
    except Exception as exc:  # the reads through Python are still seen
        sys.stderr.write(f"isoprobe: cannot watch native readers ({type(exc).__name__}: {exc})\n")


def _path_of(args, kwargs, name):
    value = args[0] if args else kwargs.get(name)
    return value if isinstance(value, (str, bytes, os.PathLike)) else None


def _shared(args, kwargs):
    return bool(args[1] if len(args) > 1 else kwargs.get("shared"))


def _wrap_torch(torch, note):
    import functools

    original = getattr(torch, "from_file", None)
    if callable(original) and not hasattr(original, "__isoprobe_wrapped__"):

        @functools.wraps(original)
        def from_file(*args, **kwargs):
            _note(note, _path_of(args, kwargs, "filename"), "r+b" if _shared(args, kwargs) else "rb")
            return original(*args, **kwargs)

        from_file.__isoprobe_wrapped__ = True
        torch.from_file = from_file
    storage = getattr(torch, "UntypedStorage", None)
    base = getattr(getattr(torch, "_C", None), "StorageBase", None)
    raw = vars(base).get("from_file") if base is not None else None
    if storage is not None and raw is not None and "from_file" not in vars(storage):

        def storage_from_file(cls, *args, **kwargs):
            _note(note, _path_of(args, kwargs, "filename"), "r+b" if _shared(args, kwargs) else "rb")
            return raw.__get__(None, cls)(*args, **kwargs)

        storage_from_file.__doc__ = getattr(raw, "__doc__", None)
        storage.from_file = classmethod(storage_from_file)
    jit = getattr(torch, "jit", None)
    load = getattr(jit, "load", None)
    if callable(load) and not hasattr(load, "__isoprobe_wrapped__"):

        @functools.wraps(load)
        def jit_load(*args, **kwargs):
            _note(note, _path_of(args, kwargs, "f"), "rb")  # a file object was opened by Python: seen already
            return load(*args, **kwargs)

        jit_load.__isoprobe_wrapped__ = True
        jit.load = jit_load


def _wrap(name, module, note):
    """Wrap torch's, safetensors' (``safe_open`` in each of its modules loaded) or tokenizers' native readers."""
    try:
        import functools

        if name == "torch":
            _wrap_torch(module, note)
        elif name == "safetensors":
            original = getattr(module, "safe_open", None)
            if original is None or hasattr(original, "__isoprobe_wrapped__"):
                return

            @functools.wraps(original, updated=())
            def safe_open(*args, **kwargs):
                _note(note, _path_of(args, kwargs, "filename"), "rb")
                return original(*args, **kwargs)

            safe_open.__isoprobe_wrapped__ = True
            for loaded in [m for n, m in list(sys.modules.items()) if n == name or n.startswith(name + ".")]:
                if getattr(loaded, "safe_open", None) is original:
                    loaded.safe_open = safe_open
        elif name == "tokenizers":
            tokenizer = getattr(module, "Tokenizer", None)
            original = getattr(tokenizer, "from_file", None)
            if original is None or hasattr(original, "__isoprobe_wrapped__"):
                return

            @functools.wraps(original, updated=())
            def from_file(*args, **kwargs):
                _note(note, _path_of(args, kwargs, "path"), "rb")
                return original(*args, **kwargs)

            from_file.__isoprobe_wrapped__ = True
            tokenizer.from_file = staticmethod(from_file)
    except Exception:  # an immutable type, another version's layout: its reads stay unseen, the module works
        pass


def _note(note, path, mode):
    if path is not None:
        try:
            note("open", (path, mode, 0))
        except Exception:
            pass


class _NativeReaderFinder:
    """Waits for the readers' modules to be imported, then wraps their readers; finds nothing itself."""

    def __init__(self, names, note):
        self.names, self.note = list(names), note

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        self.names.remove(name)
        if not self.names and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module, note = spec.loader.exec_module, self.note

        def exec_module(module):
            run_module(module)
            _wrap(name, module, note)

        spec.loader.exec_module = exec_module  # this spec's own loader object: nothing else shares it
        return spec


def held_files(wanted):
    """The real paths of the regular files this process has mapped other than as code and not writable-shared, or
    open for reading only, for which ``wanted(path)`` is true (outside the system's and hidden folders)."""
    found, code = set(), set()
    try:
        with open("/proc/self/maps", "rb") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) < 6 or not fields[5].startswith(b"/"):
                    continue
                path = os.fsdecode(fields[5].rstrip(b"\n"))
                permissions = fields[1]
                if permissions[2:3] == b"x":
                    code.add(path)
                elif permissions[1:2] != b"w" or permissions[3:4] != b"s":
                    found.add(path)
    except OSError:
        pass
    found = {path for path in found - code if _candidate(path) and wanted(path)}
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        descriptors = []
    for descriptor in descriptors:
        try:
            path = os.readlink(f"/proc/self/fd/{descriptor}")
            if path in found or not path.startswith("/") or not _candidate(path) or not wanted(path):
                continue
            with open(f"/proc/self/fdinfo/{descriptor}", "rb") as info:
                flags = next((int(line.split()[1], 8) for line in info if line.startswith(b"flags:")), None)
            if flags is not None and flags & os.O_ACCMODE == os.O_RDONLY and os.path.isfile(path):
                found.add(path)
        except (OSError, ValueError, IndexError):
            continue
    return found


def _candidate(path):
    return not (path.endswith(" (deleted)") or path.startswith(_SYSTEM) or "/." in path)
