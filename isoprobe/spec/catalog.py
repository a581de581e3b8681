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

#: A ``@register_model(...)`` line or a ``def`` line. One pattern scanned over a whole file
#: visits only these lines (the Python loop below runs a few hundred times in all, not once
#: per line of ~1 MB of source). Lines are found by their leading newline, not by ``^`` in
#: MULTILINE mode: a pattern that starts with a literal lets the regex engine jump from one
#: newline to the next, several times faster. [^\S\n] is whitespace within the line, as when
#: each line was matched on its own.
_DECORATOR_OR_DEF = re.compile(
    r'\n(?:@register_model\((?:name[^\S\n]*=[^\S\n]*["\']([^"\'\n]+)["\'])?\)|def[^\S\n]+(\w+)[^\S\n]*\()'
)


def package_folder(name: str) -> Path | None:
    """Where an installed package's files are, found without importing it (importing torch takes seconds)."""
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations)))


@functools.lru_cache(maxsize=1)
def torchvision_model_names() -> frozenset[str] | None:
    """Registered torchvision model names, or None when they cannot be read from source.

    A decorator line names the model (its ``name=`` or, without one, the next
    ``def`` after it); a ``def`` with no decorator pending is not a model.
    """
    package = package_folder("torchvision")
    if package is None:
        return None
    models_dir = package / "models"
    names: set[str] = set()
    for source in models_dir.rglob("*.py"):
        try:
            text = source.read_text(encoding="utf-8")
        except OSError:
            continue
        if "@register_model(" not in text:  # layers, helpers, __init__: nothing registered, nothing to scan
            continue
        pending: str | None = None
        for match in _DECORATOR_OR_DEF.finditer("\n" + text):  # "\n": the first line is a line too
            name, definition = match.groups()
            if definition is None:  # a decorator line
                pending = name or ""
            elif pending is not None:
                names.add(pending or definition)
                pending = None
    return frozenset(names) or None


def suggest(name: str, known: frozenset[str]) -> list[str]:
    """Close spellings of an unknown model name, best first."""
    return difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
