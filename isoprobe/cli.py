"""The ``isoprobe`` command: parse arguments, dispatch, map every outcome to a documented exit code.

Subcommands: ``run`` (probe), ``validate`` (check a spec, run nothing),
``schema`` (the result's JSON Schema). Nothing here imports torch; ``run``
reaches torch only through child processes.

Start-up time is part of the interface (``validate`` and ``schema`` are meant
for editors, CI and scripts; ``benchmarks/cli_startup.py`` measures it), so
each command imports only what it uses, inside its ``cmd_*`` function: the
module level needs nothing beyond argparse, and ``--help``/``--version`` (which
exit inside ``parse_args``) import neither pydantic nor YAML; ``validate``
imports the spec model but not the result model or the probe.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from isoprobe import __version__

if TYPE_CHECKING:  # annotations only (postponed by ``from __future__ import annotations``)
    from typing import Sequence

EXIT_CODES_HELP = """exit codes:
  0    answered: the maximum is proven (edge found, or a cap reached)
  2    bad spec or usage
  3    not even the start batch fits
  4    the probe could not answer (a trial raised an error, crashed or timed out)
  130  interrupted (SIGINT); 143 terminated (SIGTERM)
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="isoprobe",
        description="Find the exact largest training batch that fits, one fresh process per trial.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"isoprobe {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_overrides(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("spec", help="path to the YAML spec")
        sub.add_argument("--device", help="override the spec's device: auto, cpu, cuda, cuda:N")
        sub.add_argument("--memory-budget", help="override memory_budget, e.g. 8GiB or '16 GB'")
        sub.add_argument("--max-batch-size", type=int, help="override search.max_batch_size")

    run = commands.add_parser(
        "run",
        help="probe: find the largest batch that fits and print the result as JSON",
        description="Probe the spec; one JSON document on stdout, progress on stderr.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    with_overrides(run)
    run.add_argument(
        "--format", choices=("auto", "json", "table"), default="auto",
        help="stdout: json (the machine contract), table (for people), or auto (default): table when stdout is "
             "a terminal, json when it is a pipe or a file",
    )
    show = commands.add_parser("show", help="render a saved result (JSON from 'isoprobe run') as a table")
    show.add_argument("result", help="path to a result JSON file")
    show.add_argument("--format", choices=("table", "json"), default="table")
    plot = commands.add_parser("plot", help="draw a saved result: peak memory and throughput over the batch (PNG)")
    plot.add_argument("result", help="path to a result JSON file")
    plot.add_argument("-o", "--output", help="PNG to write (default: next to the result, .png)")
    validate = commands.add_parser("validate", help="check a spec without running anything")
    with_overrides(validate)
    schema = commands.add_parser("schema", help="print the JSON Schema of the result (or of the spec)")
    schema.add_argument("--spec", action="store_true", help="the spec's schema instead of the result's")
    return parser


def _overrides(args: argparse.Namespace) -> dict:
    return {"--device": args.device, "--memory-budget": args.memory_budget, "--max-batch-size": args.max_batch_size}


def _load(args: argparse.Namespace):
    from isoprobe.spec import check_references, load_spec

    spec = load_spec(args.spec, _overrides(args))
    check_references(spec, args.spec)
    return spec


def cmd_validate(args: argparse.Namespace) -> int:
    from isoprobe.errors import ExitCode

    spec = _load(args)
    source = spec.model.source
    inputs = f"input {spec.input.shape}" if spec.input is not None else f"batch {spec.model.batch}"
    task = spec.target.resolved_task if spec.target is not None else f"loss {spec.model.loss}"
    print(f"{args.spec}: valid ({source} model {getattr(spec.model, source)}, {inputs}, {task}, "
          f"{spec.training.mode} {spec.training.precision}, optimizer {spec.optimizer.name}, device {spec.device})")
    return ExitCode.ANSWERED


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from isoprobe.errors import ExitCode

    if args.spec:  # only the model asked for is imported: the result module (and its models) costs time
        from isoprobe.spec import Spec

        print(json.dumps(Spec.model_json_schema(), indent=2))
    else:
        from isoprobe.result import Result

        print(json.dumps(Result.model_json_schema(), indent=2))
    return ExitCode.ANSWERED


def cmd_run(args: argparse.Namespace) -> int:
    import signal

    from isoprobe.errors import Terminated
    from isoprobe.output import Reporter, render_table, result_json, summary_lines
    from isoprobe.probe import run_probe
    from isoprobe.result import exit_code_for

    spec = _load(args)

    def on_sigterm(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    reporter = Reporter(lambda line: print(line, file=sys.stderr, flush=True))
    budget_source = "command line" if args.memory_budget is not None else "spec"
    result = run_probe(spec, args.spec, reporter, budget_source=budget_source)
    table = args.format == "table" or (args.format == "auto" and sys.stdout.isatty())
    print(render_table(result) if table else result_json(result), flush=True)
    for line in summary_lines(result):
        print(line, file=sys.stderr)
    return exit_code_for(result.stop_reason)


def _read_result(path: str):
    """A saved result, validated against the current model; a bad file is the user's mistake (exit 2)."""
    from pydantic import ValidationError

    from isoprobe.errors import Problem, SpecError
    from isoprobe.result import Result

    try:
        text = open(path, encoding="utf-8").read()
    except OSError as exc:
        raise SpecError(path, [Problem("", f"cannot read the file: {exc.strerror or exc}", "")]) from None
    try:
        return Result.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SpecError(path, [Problem(where, f"not an isoprobe result: {first['msg']}",
                                       "give the JSON that 'isoprobe run' printed")]) from None


def cmd_show(args: argparse.Namespace) -> int:
    from isoprobe.errors import ExitCode
    from isoprobe.output import render_table, result_json

    result = _read_result(args.result)
    print(render_table(result) if args.format == "table" else result_json(result))
    return ExitCode.ANSWERED


def cmd_plot(args: argparse.Namespace) -> int:
    from isoprobe.errors import ExitCode, Problem, SpecError

    _read_result(args.result)  # a clear error for a file that is not a result, before matplotlib loads
    from isoprobe.plot import PlotUnavailable, main_plot

    try:
        return main_plot(args.result, args.output)
    except PlotUnavailable as exc:
        raise SpecError(args.result, [Problem("", str(exc), "pip install 'isoprobe[plot]'")]) from None


_COMMANDS = {"run": cmd_run, "validate": cmd_validate, "schema": cmd_schema, "show": cmd_show, "plot": cmd_plot}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Imported after parsing: --help, --version and usage errors exit inside parse_args
    # and need none of it (errors.py pulls in dataclasses, and with it inspect and ast).
    from isoprobe.errors import ExitCode, ProbeError, SpecError, Terminated

    try:
        return int(_COMMANDS[args.command](args))
    except SpecError as error:
        print(f"isoprobe: {error.render()}", file=sys.stderr)
        return ExitCode.BAD_SPEC
    except ProbeError as error:
        print(f"isoprobe: {error.message}", file=sys.stderr)
        if error.evidence:
            print(error.evidence.rstrip(), file=sys.stderr)
        return ExitCode.NO_ANSWER
    except KeyboardInterrupt:
        print("isoprobe: interrupted before the first trial", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Terminated:
        print("isoprobe: terminated before the first trial", file=sys.stderr)
        return ExitCode.TERMINATED
