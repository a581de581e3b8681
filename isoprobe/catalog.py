"""Which torchvision model names exist, known without importing torch.

``isoprobe validate`` must answer in a fraction of a second, and importing
torchvision costs seconds (it imports torch). torchvision registers every
model builder with ``@register_model()`` (or ``@register_model(name=...)``)
just above its ``def``, so reading the installed package's source gives the
same list as ``torchvision.models.list_models()``. If the source layout ever
changes and nothing is found, this returns None and the check is left to the
child, which asks torchvision itself (``child.build_model``).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import re
from pathlib import Path

_DECORATOR = re.compile(r'^@register_model\((?:name\s*=\s*["\']([^"\']+)["\'])?\)')
_DEF = re.compile(r"^def\s+(\w+)\s*\(")


@functools.lru_cache(maxsize=1)
def torchvision_model_names() -> frozenset[str] | None:
    """Registered torchvision model names, or None when they cannot be read from source."""
    try:
        found = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    models_dir = Path(next(iter(found.submodule_search_locations))) / "models"
    names: set[str] = set()
    for source in models_dir.rglob("*.py"):
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        pending: str | None = None
        for line in lines:
            decorator = _DECORATOR.match(line)
            if decorator:
                pending = decorator.group(1) or ""
                continue
            definition = _DEF.match(line) if pending is not None else None
            if definition:
                names.add(pending or definition.group(1))
                pending = None
    return frozenset(names) or None


def suggest(name: str, known: frozenset[str]) -> list[str]:
    """Close spellings of an unknown model name, best first."""
    return difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
