"""Spec fields set from outside the spec file: ``--set FIELD=VALUE``, the named flags, the Python API's overrides.

An override changes the raw data *before* validation, so it is checked exactly as
the same value written in the YAML would be (one ``SpecError`` with every
problem), and it is part of the validated spec, hence of the cache key. Each
override remembers where it came from (``origin``: ``--set search.steps=4``,
``--device``, ``overrides['search.steps']``), and a problem in a field it set is
named with it: ``search.max_batch_size (from --set search.max_batch_size=abc)``.

A ``--set`` value is YAML text (``512``, ``bf16-mixed``, ``[3, 64, 64]``,
``{lr: 0.1}``; empty is null), read by ``spec.yaml_file.parse_yaml`` under the spec
file's rules: no alias bombs, no 5000-digit or infinite numbers, no ``!!binary``.
The named flags and the API give values as they are (a flag's text, a Python
value), like the YAML's own scalars they are validated by the model.

Order: overrides apply in the order given and a later one wins, so the CLI
applies every ``--set`` (left to right) and then the named flags (``--device``,
``--memory-budget``, ``--max-batch-size``): a named flag wins over a ``--set`` of
its field. Nothing here imports pydantic or YAML.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from isoprobe.errors import Problem, shown

#: Command-line flags that override one spec field each, by flag name -> dotted field path.
OVERRIDABLE = {
    "--device": "device",
    "--memory-budget": "memory_budget",
    "--max-batch-size": "search.max_batch_size",
}

_SET_FIX = "write --set FIELD=VALUE, e.g. --set search.max_batch_size=512 (a dotted field path, '=', a YAML value)"


@dataclass(frozen=True)
class Override:
    """One field set from outside the spec file."""

    field: str  #: the dotted path, e.g. ``search.max_batch_size``
    value: Any  #: plain data (a ``--set`` value already read as YAML)
    origin: str  #: how it was given, for messages: ``--set search.steps=4``, ``--device``


def shortened(text: str, limit: int = 60) -> str:
    """A user's text for a message: a ``--set`` value may be 5000 digits long, a message may not."""
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


def parse_sets(texts: Iterable[str], source: str) -> tuple[list[Override], list[Problem]]:
    """``FIELD=VALUE`` texts (``--set``'s) -> overrides, and a problem for each text that is not one.

    The field is split off at the first ``=``, so a value may itself hold ``=``
    (``--set allocator=expandable_segments:True``). The value is parsed as YAML
    under the spec file's rules; a problem there is named with the flag.
    """
    from isoprobe.errors import SpecError
    from isoprobe.spec.yaml_file import parse_yaml

    overrides: list[Override] = []
    problems: list[Problem] = []
    for text in texts:
        origin = f"--set {shortened(text)}"
        field, equals, value_text = text.partition("=")
        field = field.strip()
        if not equals:
            problems.append(Problem(origin, "no '=' in it: a --set names a field and its value", _SET_FIX))
            continue
        if not field or any(not part or part != part.strip() for part in field.split(".")):
            problems.append(Problem(origin, f"{shortened(field)!r} is not a dotted field path", _SET_FIX))
            continue
        try:
            value = parse_yaml(value_text, source, field)
        except SpecError as error:
            problems += [Problem(f"{p.field} (from {origin})", p.message, p.fix) for p in error.problems]
            continue
        overrides.append(Override(field, value, origin))
    return overrides, problems


def from_mapping(values: Mapping[str, Any], origin: str = "overrides[{key!r}]") -> list[Override]:
    """A mapping of dotted field (or a named flag of ``OVERRIDABLE``) -> value; ``None`` values are skipped.

    ``None`` is "not given" here, as an unset flag is; to set a field to null
    from the command line, ``--set FIELD=`` (an empty YAML value) does it.
    """
    found = []
    for key, value in values.items():
        if value is None:
            continue
        if key in OVERRIDABLE:
            found.append(Override(OVERRIDABLE[key], _flag_value(key, value), key))
        else:
            found.append(Override(key, value, origin.format(key=key)))
    return found


def _flag_value(flag: str, value: Any) -> Any:
    """A named flag's text as the value its field takes: ``--max-batch-size 64`` is the number 64.

    The spec's types are strict (``spec.base``): the text "64" is not a number
    there, so the one flag whose field is a number reads its text as one when it
    is a whole number (at most ``MAX_NUMBER_DIGITS`` digits, as in a file);
    anything else stays text and is refused with the flag named.
    """
    from isoprobe.spec.yaml_file import MAX_NUMBER_DIGITS

    if flag == "--max-batch-size" and isinstance(value, str):
        text = value.strip()
        if text.isdigit() and text.isascii() and len(text) <= MAX_NUMBER_DIGITS:
            return int(text)
    return value


def apply(raw: dict[str, Any], overrides: Iterable[Override]) -> tuple[dict[str, str], list[tuple[str, Problem]]]:
    """Set every override in ``raw`` (in place, in order); the origin of each path set, and what could not be set.

    The origins map each field set, and each section an override had to create
    (``--set serch.steps=4`` creates ``serch``, an unknown field), to the override,
    so that validation's problems there name it (``origin_of``). A path that runs
    through a value which is not a mapping (``--set device.index=1``) cannot be set: a problem, never a
    silently ignored override. A whole-number part indexes a list that is already there (``--set
    input.shape.0=512``: the first element of ``input.shape``); an index it does not have is a problem
    too. Each comes with the path that
    blocked it: if validation finds that path wrong anyway (``search: 5`` in the
    file), its own problem says it, and the caller leaves this one out.
    """
    origins: dict[str, str] = {}
    problems: list[tuple[str, Problem]] = []
    for override in overrides:
        parts = override.field.split(".")
        node: Any = raw
        for depth, part in enumerate(parts):
            where = ".".join(parts[:depth])
            key: str | int = part
            if isinstance(node, list):  # a list element by its index: --set input.shape.0=512
                if not (part.isdigit() and part.isascii() and int(part) < len(node)):
                    problems.append(
                        (
                            where,
                            Problem(
                                f"{override.field} (from {override.origin})",
                                f"{where} is the list {shown(node)}: {shortened(part)!r} is not the index of one "
                                f"of its {len(node)} element(s)",
                                f"give an index from 0 to {len(node) - 1}, or set {where} itself, "
                                f"e.g. --set '{where}=[...]'",
                            ),
                        )
                    )
                    break
                key = int(part)
            if depth == len(parts) - 1:
                node[key] = override.value
                origins[override.field] = override.origin
                break
            child = node[key] if isinstance(key, int) else node.get(key)  # an int key: node is a list
            if child is None:
                child = node[key] = {}
                origins.setdefault(".".join(parts[: depth + 1]), override.origin)
            following = parts[depth + 1]
            if not (isinstance(child, dict) or (isinstance(child, list) and following.isdigit())):
                where = ".".join(parts[: depth + 1])
                problems.append(
                    (
                        where,
                        Problem(
                            f"{override.field} (from {override.origin})",
                            f"{where} is {type(child).__name__} {shown(child)}, not a section of fields",
                            f"set {where} itself, e.g. --set '{where}=...'",
                        ),
                    )
                )
                break
            node = child
    return origins, problems


def origin_of(field: str, origins: Mapping[str, str]) -> str | None:
    """The override that set ``field`` or a section around it (the longest such path), or None."""
    best = None
    for path, origin in origins.items():
        if (field == path or field.startswith(path + ".")) and (best is None or len(path) > len(best[0])):
            best = (path, origin)
    return best[1] if best else None


_OVER_FIX = (
    "write --over FIELD=V1,V2,..., e.g. --over input.shape.0=128,256,512 (a dotted field path as --set "
    "takes it, '=', YAML values separated by commas)"
)


def parse_over(text: str, source: str) -> tuple[str, list[Any]]:
    """``--over FIELD=V1,V2,...`` (``isoprobe frontier``'s) -> the field and its values; one ``SpecError`` otherwise.

    The values are read as one YAML flow list (``[`` text ``]``), so a value may
    be a list itself (``--over input.shape=[3,64,64],[3,128,128]``), under the spec
    file's rules as a ``--set`` value is. Each value is then validated as a
    ``--set`` of the field would be (``load_spec``), which names the field.
    Refused here: no ``=``, a field that is not a dotted path, no value, a value
    given twice.
    """
    from isoprobe.errors import SpecError
    from isoprobe.spec.yaml_file import parse_yaml

    origin = f"--over {shortened(text)}"
    field, equals, values_text = text.partition("=")
    field = field.strip()

    def refused(where: str, message: str):
        return SpecError(source, [Problem(where, message, _OVER_FIX)])

    if not equals:
        raise refused(origin, "no '=' in it: --over names a field and its values")
    if not field or any(not part or part != part.strip() for part in field.split(".")):
        raise refused(origin, f"{shortened(field)!r} is not a dotted field path")
    try:
        values = parse_yaml(f"[{values_text}]", source, field) if values_text.strip() else []
    except SpecError as error:
        raise SpecError(
            source, [Problem(f"{p.field} (from {origin})", p.message, _OVER_FIX) for p in error.problems]
        ) from None
    if not values or any(value is None for value in values):
        raise refused(
            f"{field} (from {origin})", "no value to probe at (an empty list, or an empty value between commas)"
        )
    seen: list[Any] = []
    for value in values:
        if value in seen:
            raise refused(f"{field} (from {origin})", f"the value {shortened(repr(value))} is given twice")
        seen.append(value)
    return field, values
