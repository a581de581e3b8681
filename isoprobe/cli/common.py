"""What several subcommands share: the spec with its command-line overrides, rendering a result, usage errors."""

from __future__ import annotations

import argparse
import sys


def named_overrides(args: argparse.Namespace) -> dict:
    """The flags that override one spec field each (they win over a ``--set`` of their field)."""
    return {"--device": args.device, "--memory-budget": args.memory_budget, "--max-batch-size": args.max_batch_size}


#: What errors and the result name as the spec when ``isoprobe run -- COMMAND`` is given no spec file.
COMMAND_LINE_SPEC = "<command line>"


def load(args: argparse.Namespace):
    """The spec with its overrides: every --set, left to right, then the named flags (which win for their field).

    ``isoprobe run [SPEC] -- COMMAND ...``: the command after ``--`` is the spec's ``command``; without a spec file,
    every other field is its default. ``args.spec`` is then the name errors use. A spec file that gives a command
    of its own and a command after ``--`` is a spec error naming both (issue 47): one silently replacing the other
    probed a command the user did not mean, and a ``shell: true`` file met a list it could not take.
    """
    from pathlib import Path

    from isoprobe.errors import Problem, SpecError
    from isoprobe.spec.load import check_references, load_spec
    from isoprobe.spec.yaml_file import read_spec_yaml

    command = getattr(args, "command_argv", None)
    if command is not None and not command:
        usage_error("nothing after '--': give the training command, e.g. -- python train.py --batch-size {batch_size}")
    if args.spec is None:
        if command is None:
            usage_error(
                "give a spec (isoprobe run SPEC.yaml) or the job's command after '--' (isoprobe run -- "
                "python train.py --batch-size {batch_size})"
            )
        args.spec = COMMAND_LINE_SPEC
        spec = load_spec({"command": command}, named_overrides(args), sets=args.set, name=COMMAND_LINE_SPEC)
    else:
        if command is not None and "command" in (written := read_spec_yaml(Path(args.spec))):
            shown = (
                written["command"] if isinstance(written["command"], str) else " ".join(map(str, written["command"]))
            )
            raise SpecError(
                args.spec,
                [
                    Problem(
                        "command",
                        f"the spec gives a command ({shown[:120]!r}) and the command line gives another after "
                        f"'--' ({' '.join(command)[:120]!r})",
                        "give the command in one place: remove command from the spec, or drop what follows '--'",
                    )
                ],
            )
        overrides = {**named_overrides(args), **({"command": command} if command is not None else {})}
        spec = load_spec(args.spec, overrides, sets=args.set)
    check_references(spec, args.spec)
    return spec


def budget_overridden(args: argparse.Namespace) -> bool:
    """Did the command line set memory_budget (``--memory-budget`` or ``--set memory_budget=...``)?"""
    return args.memory_budget is not None or any(text.partition("=")[0].strip() == "memory_budget" for text in args.set)


def usage_error(message: str, command: str = "run"):
    """A command line that cannot work, found before anything ran: one line, exit 2."""
    from isoprobe.errors import ExitCode
    from isoprobe.report.streams import tell

    tell(f"isoprobe {command}: {message}")
    raise SystemExit(ExitCode.BAD_SPEC)


def single_over(given: list[str] | None, command: str) -> str | None:
    """The one ``--over`` of a frontier or sweep; a second is refused (exit 2), never silently put in the first's place.

    A frontier varies one field: its points, its borrowed bounds and its table are over one axis. Two fields
    would need a grid, which neither command does; so two ``--over`` are a usage error that says what to do.
    """
    if not given:
        return None
    if len(given) > 1:
        from isoprobe.spec.overrides import shortened

        shown = ", ".join(f"--over {shortened(text)}" for text in given)
        usage_error(
            f"--over is given {len(given)} times ({shown}): a {command} varies one field. Give one --over "
            "and fix the others with --set FIELD=VALUE, or run one per value of the other field",
            command,
        )
    return given[0]


def wants_table(fmt: str) -> bool:
    """``table``, or ``auto`` on a terminal: people read it; a pipe or a file gets JSON."""
    return fmt == "table" or (fmt == "auto" and sys.stdout.isatty())


def render(result, fmt: str) -> str:
    """The result in one of ``run``'s formats: json, table, env, taskprolog, or auto."""
    from isoprobe.report.output import render_table, result_json

    if fmt in ("env", "taskprolog"):
        from isoprobe.report.shell import render as render_shell
        from isoprobe.report.shell import result_variables

        usable = result.answered and result.recommended_batch_size is not None
        return render_shell(result_variables(result), [] if usable else [result.message], fmt)
    if wants_table(fmt):
        return render_table(result)
    return result_json(result)


def read_result(path: str, frontier: bool = False):
    """A saved result, validated against the current model; a bad file is the user's mistake (exit 2).

    ``frontier``: an ``isoprobe frontier`` document is taken too (a ``FrontierResult``), told apart by its
    ``field`` and ``points``.

    Read as ``spec.safe_read`` reads a spec: a regular file only (``/dev/zero`` or a FIFO
    would never end), at most ``MAX_RESULT_BYTES``.
    """
    from pydantic import ValidationError

    from isoprobe.errors import Problem, SpecError
    from isoprobe.report.result import MAX_RESULT_BYTES, Result
    from isoprobe.spec.safe_read import NOT_A_PIPE, Refused, read_regular_file

    try:
        text = read_regular_file(path, MAX_RESULT_BYTES, what="a result file")
    except Refused as exc:
        fix = NOT_A_PIPE if exc.kind not in (None, "a directory") else "give the JSON file that 'isoprobe run' printed"
        raise SpecError(path, [Problem("", exc.reason, fix)]) from None
    except OSError as exc:
        raise SpecError(path, [Problem("", f"cannot read the file: {exc.strerror or exc}", "")]) from None
    try:
        if frontier and b'"points"' in bytes(text) and b'"field"' in bytes(text):
            from isoprobe.report.frontier import FrontierResult

            return FrontierResult.model_validate_json(text)
        return Result.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SpecError(
            path,
            [Problem(where, f"not an isoprobe result: {first['msg']}", "give the JSON that 'isoprobe run' printed")],
        ) from None
