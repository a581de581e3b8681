"""Answers kept on disk, so a pre-job hook that asks again answers in a blink.

A probe costs minutes of GPU time and its answer only changes when something it
depends on changes, so a result is stored under a key made of all of that: the
resolved spec (with overrides), the code of the user's factory files, the device
(the GPU model, memory and driver from NVML, or the CPU's facts and the trials' intra-op
threads, ``cache.threads``), the torch,
torchvision and model-library versions, the allocator setting and isoprobe's own
version. Which node or job asked is not in the key: a job array on identical GPUs
shares one answer. What is not in it either: memory other processes hold on the
GPU at the time (the probe measures what was free then).

What the key cannot cover, the entry does: the other source files the trials
imported and read (``cache.sources``: a path through a symbolic link keyed with
where it leads, what native readers read where the children can see it),
re-hashed on every hit. And what an entry says is
checked before it is believed (``cache.trust``); its file is read only as a
regular file of bounded size (``system.files``).

The hit path imports neither torch nor the probe, so it costs what the CLI's start-up
costs. Writers are safe in numbers: an entry is written to a temporary file and
renamed over the old one (a reader sees the old entry or the new one, never half of
one), and a lock per key makes concurrent runs of the same setup single-flight: the
first probes, the others wait for its answer instead of probing too. The lock is a
``flock`` on a regular file (``system.files.KeyLock``), which the kernel releases if
its holder dies.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from isoprobe import __version__
from isoprobe.cache.threads import trial_threads
from isoprobe.spec.data import DATA_CALLABLE_FIELDS
from isoprobe.spec.model import Spec
from isoprobe.spec.model_section import CALLABLE_FIELDS, is_file_reference
from isoprobe.system import hardware
from isoprobe.system.files import KeyLock, read_bounded, sha256_of
from isoprobe.system.hardware import cpu_name, ram_bytes, unresolved_reason, visible_devices

CACHE_DIR_VARIABLE = "ISOPROBE_CACHE_DIR"
#: Bumped when the key's recipe or the entry's promises change, so old entries are simply not found
#: (2: entries record the sources their trials ran; 3: the step holds its output through backward, and
#: the recommendation is soaked: an older entry answered for a different step; 4: a CPU key holds the
#: trials' threads, and the sources include the files the children read; 5: the maximum is the long run's,
#: its confirmation stepping until the peak is steady: an older entry answered for search.steps steps; 6: a
#: command's key holds its executable, its shell line's files and the listings of the folders it names, and the
#: sources of a probe's reads are bounded: ``cache.arguments``, ``cache.sources``; 7: the sources hold a path read
#: through a symbolic link as opened, keyed with where it leads, and the files native readers read where the
#: children can see them, ``child.native_reads``: an older entry may miss both).
KEY_VERSION = 7
#: An entry larger than this is refused unread (a real one with hundreds of trials is well under 1 MiB).
ENTRY_LIMIT = 16 * 1024 * 1024


def cache_directory(environ: Mapping[str, str]) -> Path:
    """``$ISOPROBE_CACHE_DIR`` (a shared filesystem for a cluster), else the user's cache folder."""
    configured = environ.get(CACHE_DIR_VARIABLE, "").strip()
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("isoprobe"))


def key_material(spec: Spec, spec_path: str, environ: Mapping[str, str], gpus: list[dict] | None) -> dict:
    """Everything that changes the answer, as plain data (the key is its hash; tests read it)."""
    device: dict[str, Any]
    if spec.device != "cpu" and gpus:
        device = {
            "backend": "cuda",
            "requested": spec.device,
            # The model, memory and driver, not the card: identical GPUs on other nodes share the answer.
            "gpus": [_keyed_gpu(g) for g in gpus],
            "allocator_environment": {
                name: environ[name] for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if name in environ
            },
        }
    else:
        # The CPU backend's answer moves with the trials' intra-op threads (``cache.threads``).
        device = {
            "backend": "cpu",
            "requested": spec.device,
            "cpu": cpu_name(),
            "ram_bytes": ram_bytes(),
            "threads": trial_threads(environ, spec.distributed.threads_per_rank),
        }
    material = {
        "key_version": KEY_VERSION,
        "isoprobe": __version__,
        "python": platform.python_version(),
        "packages": _package_versions(spec),
        "spec": _keyed_spec(spec),
        "code": _code_digests(spec, Path(spec_path).resolve().parent),
        "device": device,
    }
    if spec.command is not None:
        material["command"] = command_material(spec, environ)
    return material


def command_material(spec: Spec, environ: Mapping[str, str]) -> dict:
    """What a command's answer depends on beyond the spec (which holds the command and its folder): the values of
    the variables ``command_env`` names, and what its words name outside the installed environment
    (``cache.arguments``): files hashed (the script, a config, the launcher script it runs, the words of a shell
    line), folders listed (a dataset).

    The modules and files the command's processes imported or read are the entry's sources, recorded by its
    trials and checked when it is read (``cache.trust``), as for a factory's; the words' files are keyed
    here too, so an edited script is a new probe even where no trial's process got as far as importing it."""
    import tempfile

    from isoprobe.cache.arguments import argument_material
    from isoprobe.spec.command import command_words

    if spec.command is None:
        raise ValueError("command_material: the spec has no command")
    skip = [Path(tempfile.gettempdir())]
    if environ.get(CACHE_DIR_VARIABLE, "").strip():
        skip.append(cache_directory(environ))
    named = argument_material(command_words(spec.command, spec.shell), spec.shell, Path(spec.command_dir or "."), skip)
    return {"environment": {name: environ.get(name) for name in spec.command_env}, **named}


def _keyed_gpu(gpu: dict) -> dict:
    """One GPU's facts in the key. A MIG instance (``MIG-`` UUID, ``hardware.select_visible``) is keyed by its own
    name (the profile's, where the driver gives one) and memory, and marked as one: a 1g.10gb slice never shares an
    answer with a 3g.40gb one or with the whole card. Its UUID is not keyed, as no card's is: identical slices on
    other GPUs and nodes give the same answer."""
    facts = {k: gpu[k] for k in ("name", "total_memory_bytes", "driver_version")}
    if str(gpu.get("uuid", "")).startswith("MIG-"):
        facts["mig_instance"] = True
    return facts


def _keyed_spec(spec: Spec) -> dict:
    """The spec as the key holds it: all of it but ``distributed.launcher`` and ``distributed.steps_ahead``, which
    say how the ranks were started, not what they ran (a local gang of 8 and an 8-rank Slurm step answer the same
    question)."""
    dumped = spec.model_dump(mode="json")
    dumped.get("distributed", {}).pop("launcher", None)
    dumped.get("distributed", {}).pop("steps_ahead", None)
    return dumped


def uncacheable_gpu_probe(
    spec: Spec, gpus: list[dict] | None, environ: Mapping[str, str], gpu_present: bool | None = None
) -> str | None:
    """Why this probe must neither read nor write the cache, or None: a CUDA probe without its GPU's facts.

    The key holds the GPU's model, memory and driver (from NVML). Where NVML cannot name the
    trials' GPUs (no NVML library in a container, a UUID prefix CUDA accepts and NVML does not,
    an old MIG identifier), or cannot tell which GPU or MIG instance CUDA will pick (a number or no
    list on a MIG node; a number on a node of mixed GPUs under CUDA's default order:
    ``hardware.unresolved_reason``, whose reason is given), ``key_material`` would make a CPU key for a GPU
    probe, and GPUs of different sizes would share answers. A probe is a CUDA one when the spec asks for CUDA, or
    asks for ``auto`` where a GPU is present and not hidden (``gpu_present``: the driver lists a
    GPU; read from the system when None).
    """
    if spec.device == "cpu" or gpus:
        return None
    if spec.device == "auto":
        if environ.get("CUDA_VISIBLE_DEVICES") is not None and not environ["CUDA_VISIBLE_DEVICES"].strip():
            return None  # every GPU hidden: the probe runs on the CPU backend
        if not (driver_lists_a_gpu() if gpu_present is None else gpu_present):
            return None
    devices = hardware.nvml_devices()  # read only here, on a probe already refused a key: seldom
    why = unresolved_reason(devices, visible_devices(environ)) if devices else None
    if why is not None:
        return (
            f"the cache is not used: the trials' GPU cannot be named from here, so its memory (the cache key's "
            f"device facts) is unknown: {why}"
        )
    return (
        "the cache is not used: the GPU's model, memory and driver (the cache key's device facts) could not "
        "be read through NVML, and without them GPUs of different sizes would share answers"
    )


def driver_lists_a_gpu() -> bool:
    """Does the NVIDIA driver show a GPU here (its /proc entries, or a /dev/nvidiaN node)? No CUDA, no NVML."""
    return any(Path("/proc/driver/nvidia/gpus").glob("*")) or any(
        name.name[len("nvidia") :].isdigit() for name in Path("/dev").glob("nvidia[0-9]*")
    )


def cache_key(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _package_versions(spec: Spec) -> dict[str, str | None]:
    """Installed versions, read from the distributions' metadata: nothing is imported."""
    from importlib import metadata

    names = ["torch", "torchvision"]
    library = spec.model.library
    if library is not None and library not in names:
        names.append(library)
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    versions["torch_cuda"] = _torch_cuda_version()
    return versions


def _torch_cuda_version() -> str | None:
    """The CUDA release torch was built with, from torch/version.py's text (importing torch takes seconds)."""
    from isoprobe.spec.catalog import package_folder

    package = package_folder("torch")
    if package is None:
        return None
    try:
        text = (package / "version.py").read_text()
    except OSError:
        return None
    match = re.search(r"^cuda\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


def _code_digests(spec: Spec, spec_dir: Path) -> dict[str, str]:
    """SHA-256 of the user's files the spec's factory, batch and loss come from, and of ``model.depends_on``:
    editing the model is a new key."""
    digests = {}
    references = [(name, getattr(spec.model, name)) for name in CALLABLE_FIELDS]
    if spec.data is not None:  # the dataset's code is tracked as the model's; the files it reads via child.reads
        references += [(f"data.{name}", getattr(spec.data, name)) for name in DATA_CALLABLE_FIELDS]
    for name, reference in references:
        if reference is None:
            continue
        target = reference.rsplit(":", 1)[0]
        if is_file_reference(target):
            candidates = [Path(target)]
        else:  # a module found from the spec's folder (where the child looks first)
            relative = Path(*target.split("."))
            candidates = [spec_dir / relative.with_suffix(".py"), spec_dir / relative / "__init__.py"]
        for file in candidates:
            try:
                digests[name] = hashlib.sha256(file.read_bytes()).hexdigest()
                break
            except OSError:
                continue
    for entry in spec.model.depends_on:  # files read where the children's audit hook cannot see (cache_reads)
        path = Path(entry) if os.path.isabs(entry) else spec_dir / entry
        try:
            digests[f"depends_on:{entry}"] = sha256_of(path) or "missing"
        except OSError as exc:  # not a regular file (the loader refuses one): its kind is the key's, never a hang
            digests[f"depends_on:{entry}"] = f"unreadable: {exc}"
    return digests


class ResultCache:
    """One folder of ``KEY.json`` entries with a ``KEY.lock`` beside each."""

    def __init__(self, directory: Path):
        self.directory = directory

    def entry(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def lock(self, key: str) -> KeyLock:
        """A lock on one key, held while its answer is probed and written (see the module's docstring)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return KeyLock(self.directory / f"{key}.lock")

    def read(self, key: str) -> str | None:
        """The entry's text, or None when there is none.

        ``UntrustedFile`` when the name holds no regular file within ``ENTRY_LIMIT``
        (a FIFO, a link, a folder, a huge file), ``ValueError`` when it is not
        UTF-8; other errors (permissions) are the caller's.
        """
        data = read_bounded(self.entry(key), ENTRY_LIMIT)
        return None if data is None else data.decode("utf-8")

    def write(self, key: str, text: str) -> Path:
        """Atomically: a temporary file in the same folder, flushed to disk, renamed over the entry."""
        self.directory.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o644)  # mkstemp makes it 0600; a shared cache is read by other users' jobs
            os.replace(temporary, self.entry(key))
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        return self.entry(key)


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
