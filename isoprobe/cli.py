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
  0    answered: the maximum is proven (edge found, or a cap reached), or read from the cache;
       with --fallback-batch-size also when the probe could not answer (the fallback was printed)
  2    bad spec or usage
  3    not even the start batch fits
  4    the probe could not answer (a trial raised an error, crashed or timed out)
  130  interrupted (SIGINT); 143 terminated (SIGTERM); 141 stdout closed early (a pipe to head)
"""

RUN_FORMATS = ("auto", "json", "table", "env", "taskprolog")


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
        "--format", choices=RUN_FORMATS, default="auto",
        help="stdout: json (the machine contract), table (for people), env (export lines for "
             "eval \"$(isoprobe run ...)\" in sh/bash/dash), taskprolog (export/print lines for a Slurm "
             "TaskProlog), or auto (default): table when stdout is a terminal, json when it is a pipe or a file",
    )
    cache = run.add_argument_group("result cache (ISOPROBE_CACHE_DIR, default: the user's cache folder)")
    cache.add_argument("--no-cache", action="store_true", help="neither read nor write the cache: always probe")
    cache.add_argument("--refresh", action="store_true", help="probe again and replace the cached answer")
    hook = run.add_argument_group("hook mode (Slurm prologs, job scripts, container entrypoints)")
    hook.add_argument(
        "--fallback-batch-size", type=int, metavar="N",
        help="if the probe cannot answer (bad spec, nothing fits, a failed trial, an internal error), print N as "
             "ISOPROBE_BATCH_SIZE with a warning and exit 0 instead of failing the job; needs --format env or "
             "taskprolog",
    )
    hook.add_argument("--log", metavar="FILE", help="also append progress, errors and the result JSON to FILE")
    show = commands.add_parser("show", help="render a saved result (JSON from 'isoprobe run') as a table")
    show.add_argument("result", help="path to a result JSON file")
    show.add_argument("--format", choices=("table", "json", "env", "taskprolog"), default="table")
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


class _Log:
    """``--log FILE``: a copy of everything people would read, for hooks whose stderr nobody sees."""

    def __init__(self, path: str | None):
        self._file = open(path, "a", encoding="utf-8") if path else None

    def write(self, text: str) -> None:
        if self._file is not None:
            self._file.write(text.rstrip("\n") + "\n")
            self._file.flush()

    def say(self, line: str) -> None:
        """A line for people: stderr, and the log."""
        print(line, file=sys.stderr, flush=True)
        self.write(line)


def cmd_run(args: argparse.Namespace) -> int:
    import signal

    from isoprobe.errors import Terminated

    def on_sigterm(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    if args.fallback_batch_size is not None and args.fallback_batch_size < 1:
        _usage_error("--fallback-batch-size must be at least 1")
    if args.fallback_batch_size is not None and args.format not in ("env", "taskprolog"):
        _usage_error("--fallback-batch-size needs --format env or --format taskprolog (a job reads the fallback "
                     "from ISOPROBE_BATCH_SIZE)")
    try:
        log = _Log(args.log)
    except OSError as exc:
        _usage_error(f"--log {args.log}: {exc.strerror or exc}")
    if args.fallback_batch_size is None:
        return _run_and_print(args, log)
    return _run_as_hook(args, log)


def _usage_error(message: str):
    from isoprobe.errors import ExitCode

    print(f"isoprobe run: {message}", file=sys.stderr)
    raise SystemExit(ExitCode.BAD_SPEC)


def _run_and_print(args: argparse.Namespace, log: _Log) -> int:
    from isoprobe.output import summary_lines
    from isoprobe.result import exit_code_for

    result = _result_for(args, log)
    print(_render(result, args.format), flush=True)
    log.write(_render(result, "json"))
    for line in summary_lines(result):
        log.say(line)
    return exit_code_for(result.stop_reason)


def _run_as_hook(args: argparse.Namespace, log: _Log) -> int:
    """Hook mode: never fail the job because the probe could not answer; the fallback and a warning instead."""
    import traceback

    from isoprobe.errors import ExitCode, ProbeError, SpecError
    from isoprobe.result import StopReason, exit_code_for
    from isoprobe.shell import fallback_variables, render

    try:
        result = _result_for(args, log)
    except SpecError as error:
        reason, why = "bad_spec", error.render()
    except ProbeError as error:
        reason, why = "error", error.message
        if error.evidence:
            log.write(error.evidence)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:  # a bug in isoprobe must not stop the job either; the traceback goes to the log
        log.write(traceback.format_exc())
        reason, why = "internal_error", f"{type(error).__name__}: {error}"
    else:
        log.write(_render(result, "json"))
        if result.answered or result.stop_reason in (StopReason.INTERRUPTED, StopReason.TERMINATED):
            print(_render(result, args.format), flush=True)
            return exit_code_for(result.stop_reason)
        reason, why = result.stop_reason.value, result.message
    warning = f"no probed answer ({why}); using the fallback batch size {args.fallback_batch_size}"
    log.say(f"isoprobe: {warning}")
    print(render(fallback_variables(args.fallback_batch_size, reason), [warning], args.format), flush=True)
    return ExitCode.ANSWERED


def _render(result, fmt: str) -> str:
    from isoprobe.output import render_table, result_json

    if fmt in ("env", "taskprolog"):
        from isoprobe.shell import render, result_variables

        return render(result_variables(result), [] if result.answered else [result.message], fmt)
    if fmt == "table" or (fmt == "auto" and sys.stdout.isatty()):
        return render_table(result)
    return result_json(result)


def _result_for(args: argparse.Namespace, log: _Log):
    """The result for the spec: from the cache when it holds the answer, else from a probe (then stored)."""
    from isoprobe.output import Reporter
    from isoprobe.probe.answer import answer

    return answer(
        _load(args),
        args.spec,
        Reporter(log.say),
        use_cache=not args.no_cache,
        refresh=args.refresh,
        budget_source="command line" if args.memory_budget is not None else "spec",
    )


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

    result = _read_result(args.result)
    print(_render(result, args.format))
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


def entry() -> int:
    """The ``isoprobe`` command: ``main``, behind a tiny init when isoprobe is PID 1 (a container)."""
    from isoprobe.pid1 import main_as_pid1

    return main_as_pid1(main)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # pydantic looks for plugins in every installed distribution's entry points when it builds its
    # first model: ~0.2 s with torch, transformers and timm installed, which would make a cache hit
    # (a pre-job hook's whole run) twice as slow (measured with benchmarks/cli_startup.py). isoprobe
    # uses no pydantic plugin; a user who wants one can still set the variable themselves.
    import os

    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
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
    except BrokenPipeError:
        # stdout's reader went away (``isoprobe show R.json | head``): not an error worth a traceback.
        # stdout is pointed at /dev/null so that the interpreter's final flush fails quietly too.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.STDOUT_CLOSED
