"""A spec file's bytes -> plain data (mappings, lists, text, finite numbers), or one ``SpecError``.

What a hostile or broken file could do to a YAML loader, and what stops it here:

- never end or fill memory (``/dev/zero``, a FIFO, a 10 GB file): only a regular
  file is read, at most ``MAX_SPEC_BYTES`` of it (``spec.safe_read``);
- nest a million brackets deep: PyYAML's scanner is quadratic in the depth of
  open collections (seconds for 10,000) before its parser recurses out; the
  scanner below counts the depth as it opens each collection and stops at
  ``MAX_SPEC_DEPTH``, where the file is refused, at that line and column;
- expand exponentially (a "billion laughs" alias bomb): the values are counted,
  with every alias visit, up to ``MAX_SPEC_VALUES``;
- overflow a number: an integer of 5000 digits exceeds Python's limit on
  int-from-text conversion and raises from inside PyYAML, one of 400 digits
  overflows every float it meets, and ``1e400`` is read as infinity. Every number
  is checked on the parsed node, before it is built (``MAX_NUMBER_DIGITS``,
  finite), and refused with the field it is in;
- build values no spec can hold: ``!!binary`` bytes, ``!!set`` and the like
  cannot travel to the trial as JSON, and an impossible date (``2001-13-45``, a
  timestamp to YAML) raises ``ValueError``. Dates stay the text they were
  written as; the other tags are refused; anything else a constructor raises is
  a problem of that value, named by its field.

The result is what pydantic validates next (``spec.load.load_spec``). PyYAML is
imported on first use only (see ``_spec_loader``).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

from isoprobe.errors import Problem, SpecError, shown
from isoprobe.spec.safe_read import NOT_A_PIPE, Refused, read_regular_file

#: A spec is a few dozen values. Anything far larger is a mistake or an attack (a YAML
#: "billion laughs" alias bomb expands exponentially when walked), refused before validation.
MAX_SPEC_VALUES = 10_000
MAX_SPEC_BYTES = 1_000_000
#: Levels of nested collections. A spec needs about five (model.kwargs.some_config.key);
#: PyYAML's recursion gives out at a few hundred, and its scanner slows down long before.
MAX_SPEC_DEPTH = 32
#: Digits in one integer. The largest value any field takes is a byte count (1 PiB: 16 digits).
MAX_NUMBER_DIGITS = 30

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_REFUSED_TAGS = ("binary", "set", "omap", "pairs")
NUMBER_FIX = (
    "a spec's numbers are batch sizes, steps, seconds, fractions and byte counts: write one such as 256, 0.1 or '16GiB'"
)


class _TooDeep(Exception):
    """The scanner opened more than MAX_SPEC_DEPTH nested collections; ``mark`` is where."""

    def __init__(self, mark):
        super().__init__("too deep")
        self.mark = mark


class _ValueProblem(Exception):
    """Building one node's value failed; ``node`` says where, ``message`` and ``fix`` what to say."""

    def __init__(self, node, message: str, fix: str):
        super().__init__(message)
        self.node, self.message, self.fix = node, message, fix


@functools.cache
def _spec_loader() -> type:
    """PyYAML's safe loader, bounded in depth, refusing duplicate keys and values a spec cannot hold.

    Built on first use, not at import: importing PyYAML takes ~25 ms (its reader
    compiles a large Unicode regex), and ``isoprobe schema``, the result model and
    the trial child import the spec module without ever reading YAML. The class
    never changes, so it is made once per process.

    The pure-Python loader on purpose, not ``yaml.CSafeLoader``: libyaml words its
    errors differently (e.g. it leaves out the offending character), and those
    messages are what a user sees; a spec is a few hundred bytes, parsed in about
    a millisecond either way. The depth bound below also relies on the Python
    scanner's two places where a collection opens.
    """
    import yaml

    class _SpecLoader(yaml.SafeLoader):
        """PyYAML's safe loader with the checks below."""

        def _check_depth(self, opening: int) -> None:
            # indents: one entry per open block collection; flow_level: open '[' and '{'.
            if len(self.indents) + self.flow_level + opening > MAX_SPEC_DEPTH:
                raise _TooDeep(self.get_mark())

        def fetch_flow_collection_start(self, TokenClass):
            self._check_depth(1)
            super().fetch_flow_collection_start(TokenClass)

        def add_indent(self, column: int) -> bool:
            added = super().add_indent(column)
            if added:
                self._check_depth(0)
            return added

        def construct_object(self, node, deep: bool = False):
            try:
                return super().construct_object(node, deep=deep)
            except (yaml.YAMLError, _ValueProblem):
                raise
            except Exception as exc:  # a constructor's own failure (e.g. int() or datetime) is this value's problem
                written = shown(node.value) if isinstance(node, yaml.ScalarNode) else "this value"
                raise _ValueProblem(
                    node, f"cannot read {written}: {exc}", "write plain values: numbers, text, lists and mappings"
                ) from None

    def construct_unique_mapping(loader: _SpecLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
        loader.flatten_mapping(node)
        seen: set = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                break  # unhashable: construct_mapping below reports it
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shown(key)} (YAML would keep only the last one)", key_node.start_mark
                )
            seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    def construct_as_text(loader: _SpecLoader, node: yaml.ScalarNode) -> str:
        return loader.construct_scalar(node)  # a date stays the text it was written as: JSON has no dates

    def refuse(loader: _SpecLoader, node) -> None:
        tag = node.tag.rsplit(":", 1)[-1]
        raise _ValueProblem(
            node,
            f"YAML's !!{tag} makes a value that a spec cannot hold",
            "write plain values: numbers, text, lists and mappings",
        )

    _SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_unique_mapping)
    _SpecLoader.add_constructor("tag:yaml.org,2002:timestamp", construct_as_text)
    for tag in _REFUSED_TAGS:
        _SpecLoader.add_constructor(f"tag:yaml.org,2002:{tag}", refuse)
    return _SpecLoader


def read_spec_yaml(path: Path) -> dict[str, Any]:
    """The spec file at ``path`` as plain data; a ``SpecError`` naming the file, the field and the fix otherwise."""
    source = str(path)
    data = parse_yaml(_read_text(path), source)
    if data is None:
        raise SpecError(source, [Problem("", "the file is empty", "see specs/ for examples")])
    if not isinstance(data, dict):
        raise SpecError(
            source,
            [Problem("", f"the spec must be a YAML mapping, got {type(data).__name__}", "see specs/ for examples")],
        )
    return data


def parse_yaml(text: str, source: str, field: str = "") -> Any:
    """One YAML document's text as plain data, under every rule above but the file's; one ``SpecError`` otherwise.

    ``field`` is where the text goes in a spec (a ``--set search.max_batch_size=...``
    value): its problems are named under it (``model.kwargs.depth`` for a number in
    ``--set model.kwargs={depth: 1e400}``), and a syntax error is that field's, not a
    line and column of a file. Without it, the text is a whole spec file.
    """
    import yaml  # see _spec_loader: only reading a spec needs PyYAML

    loader = None
    paths: dict[int, str] = {}
    try:
        loader = _spec_loader()(text)  # the reader checks every character here (a NUL is a YAML error)
        node = loader.get_single_node()
        paths = _paths_of(node, field)
        problems = _number_problems(node, paths)
        if problems:
            raise SpecError(source, problems)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if field:
            where, reason = field, f"{reason} (at character {mark.column + 1})" if mark else reason
        raise SpecError(
            source, [Problem(where, f"not valid YAML: {reason}", "fix the YAML syntax at that place")]
        ) from None
    except _TooDeep as exc:
        raise SpecError(
            source,
            [
                Problem(
                    field or f"line {exc.mark.line + 1}, column {exc.mark.column + 1}",
                    f"nested too deeply to be a spec (more than {MAX_SPEC_DEPTH} levels)",
                    "a spec needs a few levels; look for brackets that are never closed",
                )
            ],
        ) from None
    except _ValueProblem as exc:
        raise SpecError(source, [Problem(paths.get(id(exc.node), field), exc.message, exc.fix)]) from None
    except RecursionError:  # a path the depth bound does not cover; never a traceback
        raise SpecError(source, [Problem(field, "nested too deeply to be a spec", "")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if _count_values(data, MAX_SPEC_VALUES) > MAX_SPEC_VALUES:
        raise SpecError(
            source,
            [
                Problem(
                    field,
                    f"expands to more than {MAX_SPEC_VALUES} values (YAML aliases?)",
                    "write the spec out plainly; it needs a few dozen values",
                )
            ],
        )
    return data


def _read_text(path: Path) -> str:
    source = str(path)
    try:
        raw = read_regular_file(path, MAX_SPEC_BYTES, what="a spec file")
    except Refused as exc:
        fix = {"a directory": "give the path of a .yaml file", None: ""}.get(exc.kind, NOT_A_PIPE)
        raise SpecError(source, [Problem("", exc.reason, fix)]) from None
    except FileNotFoundError:
        raise SpecError(source, [Problem("", "no such file", "check the path to the spec")]) from None
    except OSError as exc:
        raise SpecError(source, [Problem("", f"cannot read the file: {exc.strerror or exc}", "")]) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            source,
            [
                Problem(
                    "", f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})", "save the spec as UTF-8"
                )
            ],
        ) from None


def _paths_of(root, prefix: str = "") -> dict[int, str]:
    """Every node's dotted field path ('search.steps', 'input.shape.1'), by node identity, under ``prefix``.

    Iterative, and each node once: an alias names a node already seen (its first
    path is kept), so an alias bomb costs its size in the file, not its expansion.
    """
    import yaml

    paths: dict[int, str] = {}
    stack = [(root, prefix)] if root is not None else []
    while stack:
        node, path = stack.pop()
        if id(node) in paths:
            continue
        paths[id(node)] = path
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}.{index}".lstrip(".")) for index, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = f"{path}.{_segment(key)}".lstrip(".")
                stack += [(key, name), (value, name)]
    return paths


def _segment(key) -> str:
    """A mapping key as one part of a field path; a long one shortened (a key can be 5000 digits)."""
    import yaml

    if not isinstance(key, yaml.ScalarNode):
        return "?"
    return key.value if len(key.value) <= 40 else f"{key.value[:20]}...({len(key.value)} characters)"


def _number_problems(root, paths: dict[int, str]) -> list[Problem]:
    """A Problem for every number no field can take, in the order of the file, before anything is built."""
    import yaml

    found = []
    stack = [root] if root is not None else []
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(part for pair in node.value for part in pair)
        elif isinstance(node, yaml.ScalarNode):
            message = _implausible_number(node)
            if message:
                found.append((node.start_mark.index, Problem(paths.get(id(node), ""), message, NUMBER_FIX)))
    return [problem for _, problem in sorted(found, key=lambda pair: pair[0])]


def _implausible_number(node) -> str | None:
    """Why this scalar cannot be a spec's number (too many digits, not finite), or None."""
    if node.tag == _INT_TAG:
        digits = sum(character.isalnum() for character in node.value)
        if digits > MAX_NUMBER_DIGITS:
            return f"a number with {digits} digits is far beyond any value a spec takes"
    elif node.tag == _FLOAT_TAG:
        text = node.value.replace("_", "").lower()
        if text.lstrip("+-") in (".inf", ".nan"):
            return f"{shown(node.value)} is not a finite number"
        try:
            value = float(text)
        except ValueError:
            return None  # YAML 1.1's base-60 floats (1:30.5): the constructor reads them
        if not math.isfinite(value):
            return f"{shown(node.value)} is not a finite number (it overflows to infinity)"
    return None


def _count_values(data: Any, limit: int) -> int:
    """Values in ``data`` counting every visit (aliases expand), stopping as soon as ``limit`` is passed."""
    count, stack = 0, [data]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return count
