"""The user's modules a child ran, for the cache (``cache.sources`` hashes and re-checks them in the parent).

At its end, each trial child (after its forward passes, which may import
lazily) and the inspect child list every module in ``sys.modules`` whose file
lies outside the installed environment (the standard library, site-packages,
isoprobe itself, torch's generated-code caches), with its SHA-256. Stdlib only:
never imports torch.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from pathlib import Path

import isoprobe
from isoprobe.system.files import sha256_of

#: Where torch and triton put the code they generate and import (TorchInductor, Triton): not the user's.
_GENERATED_CODE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR")


def environment_roots() -> tuple[str, ...]:
    """Folders whose modules are installed software, not the user's code (real paths, each ending in a separator)."""
    import site

    roots = {sysconfig.get_paths().get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= set(getattr(site, "getsitepackages", list)())
    user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    roots.add(user_site if isinstance(user_site, str) else None)
    roots.add(
        str(Path(isoprobe.__file__).resolve().parent)
    )  # isoprobe itself (an editable install lives in a checkout)
    roots |= {os.environ.get(name) for name in _GENERATED_CODE_VARIABLES}
    try:
        import getpass

        home = Path.home()
        roots |= {str(home / ".triton"), str(home / ".cache" / "torch_extensions")}
        roots.add(os.path.join(tempfile.gettempdir(), "torchinductor_" + getpass.getuser()))
    except Exception:  # no home or user name (a container's anonymous uid)
        pass
    inductor = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if inductor is not None:  # only if torch loaded it: never import torch from here
        try:
            roots.add(inductor.cache_dir())
        except Exception:
            pass
    return tuple(sorted({os.path.join(os.path.realpath(r), "") for r in roots if r}))


def _module_file(module) -> str | None:
    try:
        file = getattr(module, "__file__", None)
    except Exception:  # a lazy module that raises on attribute access
        return None
    return file if isinstance(file, str) and file else None


def imported_sources(
    modules: Mapping[str, object] | None = None,
    roots: tuple[str, ...] | None = None,
) -> dict[str, str]:
    """Real path -> SHA-256 of every loaded module's file outside ``roots`` (default: the installed environment).

    A module registered under an installed package's name (torch puts generated
    code under ``torch._inductor...``) is that package's, wherever its file is.
    Never raises: a file that cannot be read now is left out.
    """
    modules = dict(sys.modules if modules is None else modules)
    roots = environment_roots() if roots is None else roots
    installed: dict[str, bool] = {}

    def outside(path: str) -> bool:
        return not any(path.startswith(root) for root in roots)

    def top_level_installed(name: str) -> bool:
        top = name.partition(".")[0]
        if top not in installed:
            file = _module_file(modules.get(top))
            installed[top] = file is not None and not outside(os.path.realpath(file))
        return installed[top]

    paths = []
    for name, module in modules.items():
        file = _module_file(module)
        if file is None:
            continue
        path = os.path.realpath(file)
        if outside(path) and not ("." in name and top_level_installed(name)):
            paths.append(path)
    return file_digests(paths)


def file_digests(paths) -> dict[str, str]:
    """Path -> SHA-256 of each readable regular file among ``paths``, sorted; one that cannot be read is left out
    (the entry then simply does not depend on it). Shared with a command trial's supervisor
    (``child.command_trial.supervisor``)."""
    digests: dict[str, str] = {}
    for path in paths:
        if path in digests:
            continue
        try:
            digest = sha256_of(path)
        except (OSError, ValueError):
            continue
        if digest is not None:
            digests[path] = digest
    return dict(sorted(digests.items()))


#: At most this many modules go into a warm child's preload from what the model's code imported.
MAX_MODEL_IMPORTS = 1000


def installed_packages_imported(before: set[str], modules: Mapping[str, object] | None = None) -> list[str]:
    """The installed modules (files in site-packages: not the standard library, not isoprobe, not the user's)
    imported since ``before`` (a snapshot of ``sys.modules``' names), in the order they were imported: what the
    user's model code brought in beyond the model's library.

    The environment check reports them (``Facts.model_imports``) so that a warm child or the fork server
    imports them before its request, as it does the model's library: imported inside a fork, they left more
    behind than in a fresh process (measured: a LightningModule's file importing transformers' GPT-2, ~1.3 MiB
    more at the step's peak, one sample at a 4.5 MiB-a-sample edge). Submodules count: ``import lightning``
    imports transformers' package but not its models.
    """
    modules = dict(sys.modules if modules is None else modules)
    paths = sysconfig.get_paths()
    site = tuple(
        {os.path.join(os.path.realpath(paths[name]), "") for name in ("purelib", "platlib") if paths.get(name)}
    )
    found = []
    for name, module in modules.items():
        if name in before or name.partition(".")[0] in ("isoprobe", "__main__") or "._" in name or name.startswith("_"):
            continue
        file = _module_file(module)
        if file is not None and os.path.realpath(file).startswith(site):
            found.append(name)
    return found[:MAX_MODEL_IMPORTS]
