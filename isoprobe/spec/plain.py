"""Data that was never YAML text held to the spec file's rules: a dict spec, ``probe()``'s overrides, ``--set`` paths.

A spec file is held to its rules while it is parsed (``spec.yaml_file``: depth,
values, numbers, no values JSON cannot carry). A dict given to ``probe()``, a
value in its ``overrides`` and a dotted ``--set`` path hundreds of parts long
are not parsed, so every spec, whatever its source, passes ``plain_copy`` after
its overrides are applied and before it is validated (``spec.load.load_spec``):
one nesting check for all. Without it such data passed validation (``validate``
said "valid") and then crashed serializing the spec for the cache key or the
trial. Nothing here imports pydantic or YAML.
"""

from __future__ import annotations

import math
from typing import Any

from isoprobe.errors import Problem
from isoprobe.spec.yaml_file import MAX_NUMBER_DIGITS, MAX_SPEC_DEPTH, MAX_SPEC_VALUES, NUMBER_FIX

#: What a spec value may be besides a mapping or a list: what YAML builds and JSON carries to the trial.
_SCALARS = (str, bool, int, float, type(None))
_PLAIN_FIX = "write plain values: numbers, text, lists and mappings"


def plain_copy(data: Any, prefix: str = "") -> tuple[Any, list[Problem]]:
    """A copy of ``data`` held to the spec file's rules whatever its source; the problems, each named by its path.

    A file is held to them while it is parsed (``spec.yaml_file``); a dict given to
    ``probe()``, a value in its ``overrides``, a dotted ``--set`` path hundreds of
    parts long are not parsed, so every spec passes this one walk before it is
    validated (``spec.load.load_spec``): at most ``MAX_SPEC_DEPTH`` levels of
    collections (the top mapping is the first, as in the file), ``MAX_SPEC_VALUES``
    values, integers of at most ``MAX_NUMBER_DIGITS`` digits, finite floats, and
    nothing JSON cannot carry to the trial (a set, bytes, an object). Without it
    such data passed validation and crashed serializing the spec for the cache
    key or the child. Iterative, and it stops descending at the depth limit, so a
    million levels or a mapping that contains itself cost a few dozen steps.
    Tuples become lists, as JSON will make them anyway.
    """
    problems: list[Problem] = []
    top: list[Any] = [None]
    stack: list[tuple[Any, str, int, Any, Any]] = [(data, prefix, 1, top, 0)]
    count = 0
    while stack and len(problems) < 20:
        value, path, depth, into, key = stack.pop()
        count += 1
        if count > MAX_SPEC_VALUES:
            problems.append(_too_many_values(prefix))
            break
        if isinstance(value, (dict, list, tuple)) and depth > MAX_SPEC_DEPTH:
            problems.append(
                Problem(
                    _short_path(path),
                    f"nested too deeply to be a spec (more than {MAX_SPEC_DEPTH} levels)",
                    "a spec needs a few levels; look for a value that contains itself",
                )
            )
        elif isinstance(value, (dict, list, tuple)) and count + len(value) > MAX_SPEC_VALUES:
            problems.append(_too_many_values(_short_path(path)))
            break
        elif isinstance(value, dict):
            copy: dict = {}
            into[key] = copy
            stack.extend(reversed(_mapping_entries(value, path, depth, copy, problems)))
        elif isinstance(value, (list, tuple)):
            items = [None] * len(value)
            into[key] = items
            stack.extend(
                (item, _joined(path, index), depth + 1, items, index)
                for index, item in reversed(list(enumerate(value)))
            )
        elif isinstance(value, _SCALARS):
            message = _implausible_value(value)
            if message:
                problems.append(Problem(_short_path(path), message, NUMBER_FIX))
            into[key] = value
        else:
            problems.append(
                Problem(
                    _short_path(path),
                    f"a value of type {type(value).__name__} is not one a spec can hold "
                    "(JSON cannot carry it to the trial)",
                    _PLAIN_FIX,
                )
            )
    return top[0], problems


def _too_many_values(where: str) -> Problem:
    """The one problem of data with more values than a spec needs (the walk stops at it: nothing after counts)."""
    return Problem(
        where, f"holds more than {MAX_SPEC_VALUES} values", "write the spec out plainly; it needs a few dozen values"
    )


def _mapping_entries(
    value: dict, path: str, depth: int, copy: dict, problems: list[Problem]
) -> list[tuple[Any, str, int, Any, Any]]:
    """A mapping's entries for ``plain_copy`` to walk, in the order given, each key set in ``copy`` (its value
    filled in as the entry is popped); a key no field can have (a tuple, an object, a NaN) is a problem and left
    out. Apart from the walk because these rules are the keys', which no other value has."""
    entries = []
    for name, item in value.items():
        if not isinstance(name, _SCALARS) or (isinstance(name, float) and not math.isfinite(name)):
            problems.append(
                Problem(_short_path(path), f"a key of type {type(name).__name__} cannot be a field's name", _PLAIN_FIX)
            )
            continue
        copy[name] = None
        entries.append((item, _joined(path, name), depth + 1, copy, name))
    return entries


def _implausible_value(value: Any) -> str | None:
    """The file's number rules (``_implausible_number``) for a value that was never YAML text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number"
    # No str() of a huge one: 5000 digits exceed Python's int-to-text limit (its digits are counted from its bits).
    digits = len(str(abs(value))) if value.bit_length() <= 10_000 else int(value.bit_length() * math.log10(2)) + 1
    if digits > MAX_NUMBER_DIGITS:
        return f"a number with {digits} digits is far beyond any value a spec takes"
    return None


def _joined(path: str, part: Any) -> str:
    text = str(part) if not isinstance(part, str) or len(part) <= 40 else f"{part[:20]}...({len(part)} characters)"
    return f"{path}.{text}" if path else text


def _short_path(path: str) -> str:
    """A field path for a message: one 33 levels deep is named by its start."""
    parts = path.split(".")
    return path if len(parts) <= 8 else ".".join(parts[:6]) + "..."
