"""Loading a spec: a file, a dict or a ``Spec``, with command-line overrides, into one validated ``Spec``.

The models (``spec.py``) say what a spec is; this module turns what a person
gave into one, and names every problem for that person. Loading is split into
parse (YAML, in ``spec.yaml_file``: hostile files included), override (command-line
flags and ``--set``, in ``overrides``), validate (pydantic, every problem
collected) and resolve (paths against the spec file), and every failure on the
way becomes one ``SpecError`` that names the file, the field and the fix.
``check_references`` then checks what needs the installed packages (does the
named model or factory exist?) without importing torch or running user code.
Files a spec names are read only through ``spec.safe_read`` (regular files,
bounded). This module must not import torch.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from isoprobe.errors import Problem, SpecError, shown
from isoprobe.spec.data import DATA_CALLABLE_FIELDS
from isoprobe.spec.model import Spec
from isoprobe.spec.model_section import CALLABLE_FIELDS, EXTRAS, is_file_reference
from isoprobe.spec.overrides import Override, apply, from_mapping, origin_of, parse_sets
from isoprobe.spec.plain import plain_copy
from isoprobe.spec.safe_read import NOT_A_PIPE, Refused, kind_of, read_regular_file
from isoprobe.spec.yaml_file import read_spec_yaml

#: A spec given as data (the Python API) has no file: errors name it so, and relative paths resolve against
#: the current directory, as if the spec were a file there.
DATA_SPEC_NAME = "<dict spec>"


def load_spec(
    spec: str | os.PathLike | Mapping[str, Any] | Spec,
    overrides: Mapping[str, Any] | Sequence[Override] | None = None,
    *,
    sets: Sequence[str] = (),
    name: str | None = None,
) -> Spec:
    """Read, override, validate and resolve a spec; raise one ``SpecError`` with every problem.

    ``spec`` is a YAML file's path, or the same data as a mapping (relative paths
    in it resolve against the current directory; errors name it ``DATA_SPEC_NAME``
    there), or a ``Spec``, read as the mapping it dumps to (so a ``Spec`` built in
    code has its file references resolved as a dict's are).
    ``sets`` are ``FIELD=VALUE`` texts as ``--set`` takes them (the value is YAML,
    under the spec file's rules); ``overrides`` maps a dotted field, or a named flag
    of ``OVERRIDABLE`` (``--memory-budget``), to a value taken as it is (``None``:
    not given), or is a list of ``Override``. The sets apply first, then the
    overrides: a named flag wins over a ``--set`` of its field. See ``isoprobe.spec.overrides``.
    ``name``: what errors call a spec given as data (default ``DATA_SPEC_NAME``).
    """
    if isinstance(spec, Spec):
        spec = spec.model_dump(mode="json", exclude_unset=True)
    if isinstance(spec, Mapping):
        path = Path(name) if name else Path.cwd() / DATA_SPEC_NAME  # a name: relative paths still from here
        raw, problems = plain_copy(dict(spec))  # a copy (the overrides below must not change the caller's dict)
        if problems:
            raise SpecError(str(path), problems)
    else:
        path = Path(spec)
        raw = read_spec_yaml(path)
    source = str(path)
    given, problems = parse_sets(sets, source)
    if isinstance(overrides, Mapping):
        given += from_mapping(overrides)
    else:
        given += list(overrides or ())
    origins, blocked = apply(raw, given)
    # Every source through the file's rules, the overrides in place: a --set path 300 parts deep, a deep or
    # self-containing value given to probe() would pass validation and crash serializing the spec.
    raw, found = plain_copy(raw)
    if found:
        problems += [_with_origin(problem, origins) for problem in found]
        raise SpecError(source, problems)
    reported: set[str] = set()
    try:
        validated = Spec.model_validate(raw)
    except ValidationError as exc:
        problems += [_problem_from(error, origins) for error in exc.errors()]
        reported = {".".join(str(part) for part in error["loc"]) for error in exc.errors()}
    problems += [problem for where, problem in blocked if where not in reported]  # else validation said it
    if problems:
        raise SpecError(source, problems)
    return _resolve_paths(validated, path.parent.resolve(), source)


def _with_origin(problem: Problem, origins: Mapping[str, str]) -> Problem:
    """``problem``, its field named with the override that set it, if one did."""
    origin = origin_of(problem.field, origins)
    return Problem(f"{problem.field} (from {origin})", problem.message, problem.fix) if origin else problem


def _problem_from(error: ErrorDetails, origins: Mapping[str, str]) -> Problem:
    """Turn one pydantic error into a sentence a user can act on."""
    location = [str(part) for part in error["loc"]]
    kind = error["type"]
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    named = re.match(r"([a-z_]+(?:\.[a-z_]+)*): ", message)
    if named and kind == "value_error":
        # A check across fields (a model validator) names the field at the front of its message,
        # relative to the section it validates (the whole spec: the full dotted path).
        location, message = location + named.group(1).split("."), message[named.end() :]
    field = ".".join(location)
    fix = ""
    if kind == "extra_forbidden":
        allowed = _known_fields(location[:-1])
        close = difflib.get_close_matches(location[-1], allowed, n=1)
        message = f"unknown field {location[-1]!r}"
        fix = (f"did you mean {close[0]!r}? " if close else "") + f"known fields here: {', '.join(allowed)}"
    elif kind == "missing":
        message = "this field is required"
        fix = _describe(location) or "add it; see specs/ for examples"
    elif kind == "less_than_equal" and location == ["memory_budget"]:
        message = f"{shown(error.get('input'))} is more than 1 PiB: not a memory size"  # as parse_bytes says it
        fix = _describe(location)
    elif kind == "literal_error":
        fix = f"use one of {error.get('ctx', {}).get('expected', '')}"
    elif kind == "string_pattern_mismatch" and location == ["device"]:
        message = f"{shown(error.get('input'))} is not a device"
        fix = "use auto, cpu, cuda or cuda:N"
    elif kind in ("model_type", "dict_type"):
        given = error.get("input")
        message = f"expected a mapping of fields here, got {type(given).__name__} {shown(given)}"
        fix = "known fields here: " + ", ".join(_known_fields(location)) if _known_fields(location) else ""
    else:
        fix = _describe(location)
    if origin := origin_of(field, origins):  # set by an override: name the flag it came from
        field = f"{field} (from {origin})"
    return Problem(field, message, fix)


def _model_at(location: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Spec
    for part in location:
        if model is None or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        candidates = getattr(annotation, "__args__", (annotation,))
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def _known_fields(location: list[str]) -> list[str]:
    model = _model_at(location)
    return list(model.model_fields) if model else []


def _describe(location: list[str]) -> str:
    """The field's own documentation (first sentence) as the fix hint: documented once, shown where it matters."""
    while location and location[-1].isdigit():  # an item of a list: describe the list
        location = location[:-1]
    parent = _model_at(location[:-1]) if location else None
    if parent is None or not location or location[-1] not in parent.model_fields:
        return ""
    description = parent.model_fields[location[-1]].description or ""
    return re.split(r"(?<=\.)\s+(?=[A-Z])", description, maxsplit=1)[0]


def _resolve_paths(spec: Spec, base: Path, source: str) -> Spec:
    """Make file-form references (factory, batch, loss, data.dataset...) absolute, so the child finds them from
    any folder."""
    update: dict[str, Any] = _resolved_references(spec.model, CALLABLE_FIELDS, "model", base, source)
    if spec.model.depends_on:
        update["depends_on"] = [_dependency(base, entry, source) for entry in spec.model.depends_on]
    sections: dict[str, Any] = {}
    if update:
        sections["model"] = spec.model.model_copy(update=update)
    if spec.data:
        data_update = _resolved_references(spec.data, DATA_CALLABLE_FIELDS, "data", base, source)
        if data_update:
            sections["data"] = spec.data.model_copy(update=data_update)
    if spec.command is not None:
        sections["command_dir"] = _command_dir(spec.command_dir, base, source)
    return spec.model_copy(update=sections) if sections else spec


def _command_dir(given: str | None, base: Path, source: str) -> str:
    """The command's folder as an absolute path: ``command_dir`` against the spec's folder, else the current one
    (resolved here, once, so that every trial and the cache key name the same folder)."""
    folder = (base / given).resolve() if given is not None else Path.cwd().resolve()
    if not folder.is_dir():
        what = "no such folder" if not folder.exists() else "not a folder"
        raise SpecError(
            source,
            [
                Problem(
                    "command_dir", f"{what}: {folder}", "give the folder the command runs in, relative to the spec file"
                )
            ],
        )
    return str(folder)


def _resolved_references(section, fields: tuple[str, ...], prefix: str, base: Path, source: str) -> dict[str, str]:
    """The section's file-form references as absolute paths (the ones to update); a missing file is a SpecError."""
    update = {}
    for name in fields:
        reference = getattr(section, name)
        if reference is None:
            continue
        target, function = reference.rsplit(":", 1)
        if not is_file_reference(target):
            continue
        file = (base / target).resolve()
        try:
            kind = kind_of(file.stat().st_mode)
        except OSError:
            raise SpecError(
                source,
                [Problem(f"{prefix}.{name}", f"no such file: {file}", "paths are relative to the spec file's folder")],
            ) from None
        if kind is not None:
            raise SpecError(
                source,
                [
                    Problem(
                        f"{prefix}.{name}",
                        f"{file} is {kind}, not a Python file",
                        "give a .py file" if kind == "a directory" else NOT_A_PIPE,
                    )
                ],
            )
        update[name] = f"{file}:{function}"
    return update


def _dependency(base: Path, entry: str, source: str) -> str:
    """A ``model.depends_on`` entry as an absolute path to a regular file (the cache key hashes it)."""
    file = (base / entry).resolve()
    try:
        kind = kind_of(file.stat().st_mode)
    except OSError:
        raise SpecError(
            source,
            [Problem("model.depends_on", f"no such file: {file}", "paths are relative to the spec file's folder")],
        ) from None
    if kind is not None:
        raise SpecError(
            source,
            [
                Problem(
                    "model.depends_on",
                    f"{file} is {kind}, not a regular file",
                    "list the files in it that the model reads" if kind == "a directory" else NOT_A_PIPE,
                )
            ],
        )
    return str(file)


def check_references(spec: Spec, source: str) -> None:
    """Checks that need the installed packages but not torch itself: does the named model exist?

    Fast on purpose (``isoprobe validate`` runs it); the inspect child checks the
    same things authoritatively before any trial.
    """
    from isoprobe.spec.catalog import suggest, torchvision_model_names

    problems: list[Problem] = []
    if spec.command is not None:
        problems += command_program_problems(spec)
    for name in CALLABLE_FIELDS:
        problems += _factory_problems(getattr(spec.model, name), Path(source).parent, f"model.{name}")
    for name in DATA_CALLABLE_FIELDS if spec.data is not None else ():
        problems += _factory_problems(getattr(spec.data, name), Path(source).parent, f"data.{name}")
    source_name = spec.model.source
    if source_name in EXTRAS:
        import importlib.util

        module = spec.model.library
        if module is not None and importlib.util.find_spec(module) is None:  # every source in EXTRAS has one
            problems.append(
                Problem(
                    f"model.{source_name}", f"needs the {module} package, which is not installed", EXTRAS[source_name]
                )
            )
    torchvision_name = spec.model.torchvision
    known = torchvision_model_names()
    if torchvision_name is not None and known is not None and torchvision_name not in known:
        close = suggest(torchvision_name, known)
        fix = (
            f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "see torchvision.models.list_models()"
        )
        problems.append(Problem("model.torchvision", f"torchvision has no model named {torchvision_name!r}", fix))
    if problems:
        raise SpecError(source, problems)


def command_program_problems(spec: Spec) -> list[Problem]:
    """Does the command's program exist (on PATH, or as a path from ``command_dir``), and, for ``python FILE``,
    its script? Checked before any trial: a typo there would otherwise be every trial's error."""
    import shutil

    from isoprobe.spec.command import argv_for

    if spec.shell or spec.command is None:
        # The shell resolves the line: its first word may be a variable, a builtin, a function. (Without a
        # command there is no program to look for.)
        return []
    argv = argv_for(spec.command, False, 1)
    program = argv[0]
    folder = Path(spec.command_dir or ".")
    found = (folder / program).is_file() if "/" in program else shutil.which(program) is not None
    if not found:
        where = f"in {folder}" if "/" in program else "on PATH"
        return [
            Problem(
                "command",
                f"no program {program!r} {where}",
                "give the program as the job runs it (python, torchrun, accelerate, a script's path)",
            )
        ]
    if Path(program).name.startswith("python") and (ignored := _site_skipping_flags(argv[1:])):
        return [
            Problem(
                "command",
                f"python runs with {ignored}, which skips site or PYTHONPATH: isoprobe's start-up "
                "shim (how it sees the command's optimizer steps) would never load, and every trial would "
                "time out with no step seen",
                f"drop {ignored} from the command for the probe",
            )
        ]
    if Path(program).name.startswith("python") and len(argv) > 1 and not argv[1].startswith("-"):
        script = folder / argv[1]
        if script.is_dir() and not (script / "__main__.py").is_file():
            return [
                Problem(
                    "command",
                    f"{argv[1]!r} in {folder} is a folder, not a script: python runs a folder "
                    "only when it holds a __main__.py",
                    f"name the training script inside it ({argv[1].rstrip('/')}/train.py, say), or add its __main__.py",
                )
            ]
        if argv[1].endswith(".py") and not script.exists():
            return [
                Problem(
                    "command",
                    f"no script {argv[1]!r} in {folder}",
                    "paths in the command are relative to command_dir (default: the folder isoprobe runs in)",
                )
            ]
    return []


def _site_skipping_flags(arguments: list[str]) -> str | None:
    """The first of python's own options that skip what the shim rides on: -I (isolated: no PYTHONPATH, no site
    of the user's), -E (no PYTHON* variables), -S (no site). Read up to the script or -m/-c, as python does."""
    for word in arguments:
        if not word.startswith("-") or word in ("-m", "-c", "-"):
            return None
        if word.startswith("--"):
            continue
        letters = word[1:]
        for letter in letters:
            if letter in "IES":
                return f"-{letter}"
            if letter in "WXmc":  # options that take a value: the rest of this word is it
                break
    return None


#: A Python file that a factory, batch or loss names: far larger than this is generated junk, not code.
MAX_FACTORY_BYTES = 16 << 20


def _factory_problems(factory: str | None, spec_dir: Path, field: str = "model.factory") -> list[Problem]:
    """Does the factory's module exist, and does it define the function? Checked without running it.

    A file is parsed (not imported) and its top-level names read; a module is only
    located (``find_spec`` on its top-level package). Running the factory, and what
    it raises, is the inspect child's job.
    """
    import ast
    import importlib.util
    import sys

    if factory is None:
        return []
    target, function = factory.rsplit(":", 1)
    if is_file_reference(target):
        file = Path(target)
        try:
            text = read_regular_file(file, MAX_FACTORY_BYTES, what="a Python file").decode("utf-8")
        except Refused as exc:
            return [
                Problem(
                    field,
                    f"{file} {exc.reason}",
                    NOT_A_PIPE if exc.kind not in (None, "a directory") else "give a .py file",
                )
            ]
        except (OSError, UnicodeDecodeError) as exc:
            return [Problem(field, f"cannot read {file}: {exc}", "")]
        try:
            tree = ast.parse(text, filename=str(file))
        except SyntaxError as exc:
            return [Problem(field, f"{file} line {exc.lineno}: {exc.msg}", "fix the Python syntax")]
        except ValueError as exc:  # older Pythons: "source code string cannot contain null bytes" (3.11.7: SyntaxError)
            return [Problem(field, f"{file} cannot be parsed: {exc}", "fix the Python file")]
        except (RecursionError, MemoryError) as exc:  # one expression of 200,000 terms: Python cannot compile it either
            return [
                Problem(
                    field,
                    f"{file} is nested too deeply for Python's parser ({type(exc).__name__})",
                    "split the long expression into several statements",
                )
            ]
        defined = {
            getattr(node, "name", None) for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        }
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        if function not in defined and not any(
            isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in tree.body
        ):
            close = difflib.get_close_matches(function, sorted(n for n in defined if n), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"define {function}() in {file.name}"
            return [Problem(field, f"{file.name} defines no {function!r}", hint)]
        return []
    top = target.split(".")[0]
    added = str(spec_dir.resolve()) not in sys.path
    if added:
        sys.path.insert(0, str(spec_dir.resolve()))
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    finally:
        if added:
            sys.path.remove(str(spec_dir.resolve()))
    if found is None:
        return [
            Problem(
                field,
                f"no module named {top!r} on the import path",
                "install it, or put it next to the spec, or use 'path/to/file.py:function'",
            )
        ]
    return []
