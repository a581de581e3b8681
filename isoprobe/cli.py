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
  2    bad spec or usage (also a spec path that is a pipe or a device: only regular files are read)
  3    not even the start batch fits
  4    the probe could not answer (a trial raised an error, crashed or timed out; or the system
       refused what a trial needs, e.g. no space left in TMPDIR)
  74   the result could not be written to stdout (a full disk); with --fallback-batch-size too,
       since the fallback cannot reach the job either
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
        """The spec and the flags that change it: every subcommand that reads a spec takes them all."""
        sub.add_argument("spec", help="path to the YAML spec")
        sub.add_argument("--device", help="override the spec's device: auto, cpu, cuda, cuda:N")
        sub.add_argument("--memory-budget", help="override memory_budget, e.g. 8GiB or '16 GB'")
        # Not type=int: the value is checked with the spec (named, and in hook mode answered with the fallback).
        sub.add_argument("--max-batch-size", help="override search.max_batch_size")
        # Not parsed here either: a bad --set is a spec problem (exit 2, every problem at once; hook mode: fallback).
        sub.add_argument(
            "--set", action="append", default=[], metavar="FIELD=VALUE", dest="set",
            help="override any spec field by its dotted path, e.g. --set search.max_batch_size=512 --set "
                 "training.precision=bf16-mixed; the value is YAML (a list: input.shape=[3,64,64]; empty: null), "
                 "validated as if written in the spec; repeatable, the last one for a field wins, and "
                 "--device, --memory-budget and --max-batch-size win over a --set of their field",
        )

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
        "--fallback-batch-size", type=_batch_size, metavar="N",
        help="if the probe cannot answer (bad spec, nothing fits, a failed trial, an internal error), print N as "
             "ISOPROBE_BATCH_SIZE with a warning and exit 0 instead of failing the job; needs --format env or "
             "taskprolog",
    )
    hook.add_argument("--log", metavar="FILE", help="also append progress, errors and the result JSON to FILE "
                                                   "(if it stops taking writes, a warning and the run goes on)")
    _sweep_parser(commands)
    show = commands.add_parser("show", help="render a saved result (JSON from 'isoprobe run') as a table")
    show.add_argument("result", help="path to a result JSON file")
    show.add_argument("--format", choices=("table", "json", "env", "taskprolog"), default="table")
    plot = commands.add_parser("plot", help="draw a saved result: peak memory and throughput over the batch (PNG)")
    plot.add_argument("result", help="path to a result JSON file")
    plot.add_argument("-o", "--output", help="PNG to write (default: next to the result, .png)")
    validate = commands.add_parser("validate", help="check a spec without running anything")
    with_overrides(validate)
    estimate = commands.add_parser("estimate", help="predict the memory and the maximum from one traced step "
                                                    "(no trial, no GPU memory): seconds, not minutes")
    with_overrides(estimate)
    estimate.add_argument("--format", choices=("auto", "json", "table"), default="auto",
                          help="table for people, json for scripts; auto (default): table on a terminal, else json")
    schema = commands.add_parser("schema", help="print the JSON Schema of the result (or of the spec)")
    schema.add_argument("--spec", action="store_true", help="the spec's schema instead of the result's")
    return parser


def _sweep_parser(commands) -> None:
    """``isoprobe sweep``'s flags (the work is in isoprobe/sweep/)."""
    sweep = commands.add_parser(
        "sweep", help="probe many specs (locally, or as Slurm job arrays on several GPU types): one table, one JSON",
        description="Probe every SPEC (on every --partition/--constraint with --executor slurm); one row per spec "
                    "x GPU type. Answers go to the result cache (ISOPROBE_CACHE_DIR: a shared filesystem on a "
                    "cluster), so a sweep run again answers from it without probing or submitting.",
        epilog="exit codes: 0 every row answered; 2 bad usage; 4 a row has no answer (its error says why); "
               "130 interrupted, 143 terminated (the sweep's Slurm jobs are cancelled first)",
    )
    sweep.add_argument("specs", nargs="+", metavar="SPEC", help="paths to YAML specs")
    sweep.add_argument("--executor", choices=("local", "slurm"), default="local",
                       help="local (default): one after another on this machine; slurm: one job array per GPU type")
    sweep.add_argument("--format", choices=("auto", "json", "table"), default="auto",
                       help="stdout: table (people), json (the SweepReport), auto: table on a terminal")
    sweep.add_argument("--output", metavar="FILE", help="also write the JSON report to FILE")
    sweep.add_argument("--refresh", action="store_true", help="probe again and replace the cached answers")
    sweep.add_argument("--device", help="override every spec's device")
    sweep.add_argument("--memory-budget", help="override every spec's memory_budget")
    sweep.add_argument("--max-batch-size", help="override every spec's search.max_batch_size")
    sweep.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="set",
                       help="override a field of every spec, as 'isoprobe run --set' does; repeatable")
    slurm = sweep.add_argument_group("--executor slurm (submitit; SLURM_CONF and the clients as for sbatch)")
    slurm.add_argument("--partition", action="append", default=[], metavar="NAME[,NAME]",
                       help="a GPU type as a partition; repeatable or comma-separated: one row per spec per partition")
    slurm.add_argument("--constraint", action="append", default=[], metavar="FEATURE[,FEATURE]",
                       help="a GPU type as a node feature (sbatch --constraint); repeatable or comma-separated")
    slurm.add_argument("--gpus-per-task", type=_batch_size, metavar="N", help="GPUs per probe (sbatch --gpus-per-task)")
    slurm.add_argument("--cpus-per-task", type=_batch_size, metavar="N", help="CPUs per probe (sbatch --cpus-per-task)")
    slurm.add_argument("--time", type=_batch_size, default=60, metavar="MINUTES", help="time limit per probe (default 60)")
    slurm.add_argument("--array-parallelism", type=_batch_size, default=16, metavar="N",
                       help="probes of one array running at once (sbatch --array=...%%N; default 16)")
    slurm.add_argument("--sbatch", action="append", default=[], metavar="KEY=VALUE",
                       help="an extra sbatch option, e.g. --sbatch account=proj --sbatch qos=short; repeatable")
    slurm.add_argument("--folder", default="isoprobe-sweeps", metavar="DIR",
                       help="the sweep's job files (submitit's pickles, logs, rows): private (made 0700) and on a "
                            "filesystem the nodes share (default ./isoprobe-sweeps)")


def _batch_size(text: str) -> int:
    """argparse type for --fallback-batch-size: a whole number >= 1, refused in one short line otherwise."""
    stripped = text.strip()
    if not stripped.isdigit() or len(stripped) > 9 or int(stripped) < 1:
        shown = text if len(text) <= 20 else f"{text[:12]}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"{shown!r} is not a batch size; give a whole number such as 8")
    return int(stripped)


def _overrides(args: argparse.Namespace) -> dict:
    return {"--device": args.device, "--memory-budget": args.memory_budget, "--max-batch-size": args.max_batch_size}


def _load(args: argparse.Namespace):
    """The spec with its overrides: every --set, left to right, then the named flags (which win for their field)."""
    from isoprobe.spec import check_references, load_spec

    spec = load_spec(args.spec, _overrides(args), sets=args.set)
    check_references(spec, args.spec)
    return spec


def cmd_validate(args: argparse.Namespace) -> int:
    from isoprobe.errors import ExitCode

    spec = _load(args)
    source = spec.model.source
    inputs = f"input {spec.input.shape}" if spec.input is not None else f"batch {spec.model.batch}"
    task = spec.target.resolved_task if spec.target is not None else f"loss {spec.model.loss}"
    from isoprobe.streams import emit

    step = f", the step {spec.model.step}" if spec.model.step else ""
    ranks = spec.distributed.world_size or "the job's or node's"
    distributed = f", {spec.distributed.strategy} over {ranks} ranks (batches per rank)" if spec.distributed.gang else ""
    emit(f"{args.spec}: valid ({source} model {getattr(spec.model, source)}, {inputs}, {task}, "
         f"{spec.training.mode} {spec.training.precision}{step}, optimizer {spec.optimizer.name}, device {spec.device}"
         f"{distributed})")
    return ExitCode.ANSWERED


def cmd_estimate(args: argparse.Namespace) -> int:
    """The traced estimate alone: the environment check's child, no trial (isoprobe.probe.estimate)."""
    from isoprobe.errors import ExitCode
    from isoprobe.prediction import render_report
    from isoprobe.probe.estimate import estimate_spec
    from isoprobe.streams import emit

    report = estimate_spec(_load(args), args.spec, "command line" if _budget_overridden(args) else "spec")
    table = args.format == "table" or (args.format == "auto" and sys.stdout.isatty())
    emit(render_report(report) if table else report.model_dump_json(indent=2))
    return ExitCode.ANSWERED


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from isoprobe.errors import ExitCode
    from isoprobe.streams import emit

    if args.spec:  # only the model asked for is imported: the result module (and its models) costs time
        from isoprobe.spec import Spec

        emit(json.dumps(Spec.model_json_schema(), indent=2))
    else:
        from isoprobe.result import Result

        emit(json.dumps(Result.model_json_schema(), indent=2))
    return ExitCode.ANSWERED


def cmd_run(args: argparse.Namespace) -> int:
    import signal

    from isoprobe.errors import Terminated
    from isoprobe.streams import Log, tell

    def on_sigterm(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    if args.fallback_batch_size is not None and args.format not in ("env", "taskprolog"):
        _usage_error("--fallback-batch-size needs --format env or --format taskprolog (a job reads the fallback "
                     "from ISOPROBE_BATCH_SIZE)")
    try:
        log = Log(args.log)
    except OSError as exc:
        if args.fallback_batch_size is None:  # found before anything ran: the command line is wrong
            _usage_error(f"--log {args.log}: {exc.strerror or exc}")
        tell(f"isoprobe: --log {args.log}: cannot open ({exc.strerror or exc}); running without the log")
        log = Log(None)  # in hook mode a log is never worth the job
    try:
        if args.fallback_batch_size is None:
            return _run_and_print(args, log)
        return _run_as_hook(args, log)
    finally:
        log.close()


def _usage_error(message: str, command: str = "run"):
    from isoprobe.errors import ExitCode
    from isoprobe.streams import tell

    tell(f"isoprobe {command}: {message}")
    raise SystemExit(ExitCode.BAD_SPEC)


def _run_and_print(args: argparse.Namespace, log) -> int:
    from isoprobe.output import summary_lines
    from isoprobe.result import exit_code_for
    from isoprobe.streams import emit

    result = _result_for(args, log)
    log.write(_render(result, "json"))  # first: if stdout then fails (exit 74), the log still holds the answer
    emit(_render(result, args.format))
    for line in summary_lines(result):
        log.say(line)
    return exit_code_for(result.stop_reason)


def _run_as_hook(args: argparse.Namespace, log) -> int:
    """Hook mode: never fail the job because the probe could not answer; the fallback and a warning instead.

    Whatever goes wrong before the answer (the spec, a trial, the cache, the log,
    no space for a trial's files, a bug in isoprobe) ends in the fallback and exit
    0. The one failure no fallback can cover is stdout itself: then the job gets
    nothing to read, and exit 74 (``OutputFailed``, raised by ``emit``) says so.
    """
    import traceback

    from isoprobe.errors import ExitCode, OutputFailed, ProbeError, SpecError
    from isoprobe.result import StopReason, exit_code_for
    from isoprobe.shell import fallback_variables, render
    from isoprobe.streams import emit

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
        usable = result.answered and result.recommended_batch_size is not None
        if usable or result.stop_reason in (StopReason.INTERRUPTED, StopReason.TERMINATED):
            emit(_render(result, args.format))
            return exit_code_for(result.stop_reason)
        # Answered but nothing recommended (no batch survived its soak): the job still needs a batch size.
        reason = result.stop_reason.value if not result.answered else "no_recommendation"
        why = result.message
    warning = f"no probed answer ({why}); using the fallback batch size {args.fallback_batch_size}"
    log.say(f"isoprobe: {warning}")
    try:
        emit(render(fallback_variables(args.fallback_batch_size, reason), [warning], args.format),
             what="the fallback batch size to stdout (the job gets no ISOPROBE_BATCH_SIZE)")
    except OutputFailed as error:
        log.write(f"isoprobe: {error}")  # main says it on stderr and exits 74
        raise
    return ExitCode.ANSWERED


def _render(result, fmt: str) -> str:
    from isoprobe.output import render_table, result_json

    if fmt in ("env", "taskprolog"):
        from isoprobe.shell import render, result_variables

        usable = result.answered and result.recommended_batch_size is not None
        return render(result_variables(result), [] if usable else [result.message], fmt)
    if fmt == "table" or (fmt == "auto" and sys.stdout.isatty()):
        return render_table(result)
    return result_json(result)


def _result_for(args: argparse.Namespace, log):
    """The result for the spec: from the cache when it holds the answer, else from a probe (then stored).

    The same path as the Python API's ``probe()`` (``api.answer_for``): cache ->
    lock -> probe -> store, an ``OSError`` turned into one line (``ProbeError``).
    """
    from isoprobe.api import answer_for

    spec = _load(args)
    return answer_for(spec, args.spec, log.say, use_cache=not args.no_cache, refresh=args.refresh,
                      budget_source="command line" if _budget_overridden(args) else "spec")


def _budget_overridden(args: argparse.Namespace) -> bool:
    """Did the command line set memory_budget (``--memory-budget`` or ``--set memory_budget=...``)?"""
    return args.memory_budget is not None or any(text.partition("=")[0].strip() == "memory_budget"
                                                 for text in args.set)


#: A result is a few kB per trial; far more is not a result (and is never read whole into memory).
MAX_RESULT_BYTES = 64 << 20


def _read_result(path: str):
    """A saved result, validated against the current model; a bad file is the user's mistake (exit 2).

    Read as ``safe_read`` reads a spec: a regular file only (``/dev/zero`` or a FIFO
    would never end), at most ``MAX_RESULT_BYTES``.
    """
    from pydantic import ValidationError

    from isoprobe.errors import Problem, SpecError
    from isoprobe.result import Result
    from isoprobe.safe_read import NOT_A_PIPE, Refused, read_regular_file

    try:
        text = read_regular_file(path, MAX_RESULT_BYTES, what="a result file")
    except Refused as exc:
        fix = NOT_A_PIPE if exc.kind not in (None, "a directory") else "give the JSON file that 'isoprobe run' printed"
        raise SpecError(path, [Problem("", exc.reason, fix)]) from None
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
    from isoprobe.streams import emit

    result = _read_result(args.result)
    emit(_render(result, args.format))
    return ExitCode.ANSWERED


def cmd_plot(args: argparse.Namespace) -> int:
    from isoprobe.errors import OutputFailed, Problem, SpecError

    result = _read_result(args.result)  # a clear error for a file that is not a result, before matplotlib loads
    from isoprobe.plot import PlotUnavailable, default_output, main_plot

    try:
        return main_plot(args.result, args.output, result=result)
    except PlotUnavailable as exc:
        raise SpecError(args.result, [Problem("", str(exc), "pip install 'isoprobe[plot]'")]) from None
    except OSError as exc:  # the PNG could not be written: a full disk, a folder that is not there
        raise OutputFailed(f"the plot {args.output or default_output(args.result)}", exc.strerror or str(exc)) from None


def cmd_sweep(args: argparse.Namespace) -> int:
    """Probe many specs; the table or JSON on stdout, progress on stderr (isoprobe/sweep/)."""
    import signal
    from pathlib import Path

    from isoprobe.errors import ExitCode, Terminated
    from isoprobe.streams import emit, tell

    def on_sigterm(signum, frame):
        raise Terminated()

    targets = [f"partition={name}" for text in args.partition for name in text.split(",") if name.strip()]
    targets += [f"constraint={name}" for text in args.constraint for name in text.split(",") if name.strip()]
    if bad := [text for text in args.sbatch if "=" not in text or not text.partition("=")[0].strip()]:
        _usage_error(f"--sbatch {bad[0]!r}: give KEY=VALUE, e.g. --sbatch account=myproject", "sweep")
    sbatch = dict(text.split("=", 1) for text in args.sbatch)
    if args.executor == "slurm" and not targets:
        _usage_error("sweep --executor slurm needs at least one --partition or --constraint (a GPU type)", "sweep")
    if args.executor == "local" and (targets or sbatch):
        _usage_error("--partition, --constraint and --sbatch are for --executor slurm", "sweep")
    signal.signal(signal.SIGTERM, on_sigterm)
    from isoprobe.sweep import run_sweep
    from isoprobe.sweep.model import render_sweep_table
    from isoprobe.sweep.slurm import SlurmOptions

    options = SlurmOptions(folder=Path(args.folder).resolve(), gpus_per_task=args.gpus_per_task,
                           cpus_per_task=args.cpus_per_task, time_minutes=args.time,
                           array_parallelism=args.array_parallelism, sbatch=sbatch)
    report = run_sweep(args.specs, executor=args.executor, say=tell, targets=targets, named=_overrides(args),
                       sets=tuple(args.set), refresh=args.refresh, slurm_options=options)
    document = report.model_dump_json(indent=2)
    if args.output:
        try:
            Path(args.output).write_text(document + "\n")
        except OSError as exc:
            tell(f"isoprobe: --output {args.output}: {exc.strerror or exc}")
    table = args.format == "table" or (args.format == "auto" and sys.stdout.isatty())
    emit(render_sweep_table(report) if table else document)
    if report.interrupted:
        return ExitCode.INTERRUPTED if report.interrupted == "interrupted" else ExitCode.TERMINATED
    return ExitCode.ANSWERED if report.all_answered else ExitCode.NO_ANSWER


_COMMANDS = {"run": cmd_run, "sweep": cmd_sweep, "validate": cmd_validate, "schema": cmd_schema, "show": cmd_show,
             "plot": cmd_plot, "estimate": cmd_estimate}


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
    from isoprobe.errors import ExitCode, OutputFailed, ProbeError, SpecError, Terminated
    from isoprobe.streams import detach_stdout, tell

    try:
        return int(_COMMANDS[args.command](args))
    except SpecError as error:
        tell(f"isoprobe: {error.render()}")
        return ExitCode.BAD_SPEC
    except ProbeError as error:
        tell(f"isoprobe: {error.message}")
        if error.evidence:
            tell(error.evidence.rstrip())
        return ExitCode.NO_ANSWER
    except OutputFailed as error:
        # The answer did not reach its reader: say so where a person may see it, and exit non-zero so that
        # a job script does not go on with nothing (in hook mode: not even the fallback got through).
        tell(f"isoprobe: {error}")
        detach_stdout()  # the unwritten rest must not fail again in the interpreter's final flush
        return ExitCode.OUTPUT_FAILED
    except KeyboardInterrupt:
        tell("isoprobe: interrupted before the first trial")
        return ExitCode.INTERRUPTED
    except Terminated:
        tell("isoprobe: terminated before the first trial")
        return ExitCode.TERMINATED
    except BrokenPipeError:
        # stdout's reader went away (``isoprobe show R.json | head``): not an error worth a traceback.
        # stdout is pointed at /dev/null so that the interpreter's final flush fails quietly too.
        detach_stdout()
        return ExitCode.STDOUT_CLOSED
