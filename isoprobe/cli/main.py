"""The ``isoprobe`` command: parse arguments, dispatch, map every outcome to a documented exit code.

Subcommands, each a module of ``isoprobe.cli``: ``run`` (probe), ``sweep``
(many specs), ``validate`` and ``estimate`` (a spec checked or traced, no
trial), ``schema`` (the result's JSON Schema), ``show`` and ``plot`` (a saved
result). Nothing here imports torch; ``run`` reaches torch only through child
processes.

Start-up time is part of the interface (``validate`` and ``schema`` are meant
for editors, CI and scripts; ``benchmarks/studies/cli_startup.py`` measures it), so
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
    from collections.abc import Sequence

EXIT_CODES_HELP = """exit codes (run prints its document on every one but 74, 141 and a usage error: the answer, or
answered false with stop_reason and message; --format env: ISOPROBE_ANSWERED=0, ISOPROBE_STOP_REASON):
  0    answered: the maximum is proven (edge found, or a cap reached), or read from the cache;
       with --fallback-batch-size also when the probe could not answer (the fallback was printed)
  1    a bug in isoprobe (stop_reason internal_error; the traceback on stderr)
  2    bad spec or usage (also a spec path that is a pipe or a device: only regular files are read)
  3    not even the start batch fits
  4    the probe could not answer (a trial raised an error, crashed or timed out; or the system
       refused what a trial needs, e.g. no space left in TMPDIR; or isoprobe's fork server kept failing)
  74   the result could not be written to stdout (a full disk); with --fallback-batch-size too,
       since the fallback cannot reach the job either
  130  interrupted (SIGINT); 143 terminated (SIGTERM; the message names a Slurm job's time limit
       when that sent it): the trials so far are printed, and further signals wait for that;
       141 stdout closed early (a pipe to head)
"""

RUN_FORMATS = ("auto", "json", "table", "env", "taskprolog")


def _parser() -> argparse.ArgumentParser:
    """The ``isoprobe`` command line: each subcommand's flags are built by a function of its own, in the order
    ``--help`` lists them, so that a command's flags read in one place."""
    parser = argparse.ArgumentParser(
        prog="isoprobe",
        description="Find the exact largest training batch that fits, one fresh process per trial.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"isoprobe {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _run_parser(commands)
    _sweep_parser(commands)
    _frontier_parser(commands)
    _reading_parsers(commands)
    return parser


def _with_overrides(sub: argparse.ArgumentParser, spec_optional: bool = False) -> None:
    """The spec and the flags that change it: every subcommand that reads a spec takes them all."""
    if spec_optional:
        sub.add_argument(
            "spec",
            nargs="?",
            help="path to the YAML spec (optional after which '-- COMMAND ...' is given: then the defaults)",
        )
    else:
        sub.add_argument("spec", help="path to the YAML spec")
    sub.add_argument("--device", help="override the spec's device: auto, cpu, cuda, cuda:N")
    sub.add_argument("--memory-budget", help="override memory_budget, e.g. 8GiB or '16 GB'")
    # Not type=int: the value is checked with the spec (named, and in hook mode answered with the fallback).
    sub.add_argument("--max-batch-size", help="override search.max_batch_size")
    # Not parsed here either: a bad --set is a spec problem (exit 2, every problem at once; hook mode: fallback).
    sub.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        dest="set",
        help="override any spec field by its dotted path, e.g. --set search.max_batch_size=512 --set "
        "training.precision=bf16-mixed; the value is YAML (a list: input.shape=[3,64,64]; empty: null), "
        "validated as if written in the spec; repeatable, the last one for a field wins, and "
        "--device, --memory-budget and --max-batch-size win over a --set of their field",
    )


def _run_parser(commands) -> None:
    """``isoprobe run``'s flags: the spec's, the output format, the cache and hook mode (the work is in
    isoprobe/cli/run.py). Its own function as the command with the most flags, ``--help`` lists first."""
    run = commands.add_parser(
        "run",
        help="probe: find the largest batch that fits and print the result as JSON",
        usage="isoprobe run [SPEC] [options] [-- COMMAND [ARGS...]]",
        description="Probe the spec; one JSON document on stdout, progress on stderr. After '--', the job's own "
        "training command, run as it is in each trial with {batch_size} in its arguments replaced by "
        "the trial's batch (and ISOPROBE_BATCH_SIZE set): e.g. isoprobe run -- torchrun "
        "--nproc-per-node 2 train.py --batch-size {batch_size} (docs/command.md).",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _with_overrides(run, spec_optional=True)
    run.add_argument(
        "--format",
        choices=RUN_FORMATS,
        default="auto",
        help="stdout: json (the machine contract), table (for people), env (export lines for "
        'eval "$(isoprobe run ...)" in sh/bash/dash), taskprolog (export/print lines for a Slurm '
        "TaskProlog), or auto (default): table when stdout is a terminal, json when it is a pipe or a file",
    )
    cache = run.add_argument_group("result cache (ISOPROBE_CACHE_DIR, default: the user's cache folder)")
    cache.add_argument("--no-cache", action="store_true", help="neither read nor write the cache: always probe")
    cache.add_argument("--refresh", action="store_true", help="probe again and replace the cached answer")
    hook = run.add_argument_group("hook mode (Slurm prologs, job scripts, container entrypoints)")
    hook.add_argument(
        "--fallback-batch-size",
        type=_batch_size,
        metavar="N",
        help="if the probe cannot answer (bad spec, nothing fits, a failed trial, an internal error), print N as "
        "ISOPROBE_BATCH_SIZE with a warning and exit 0 instead of failing the job; needs --format env or "
        "taskprolog",
    )
    hook.add_argument(
        "--log",
        metavar="FILE",
        help="also append progress, errors and the result JSON to FILE "
        "(if it stops taking writes, a warning and the run goes on)",
    )


def _reading_parsers(commands) -> None:
    """The commands that run no trial: ``show`` and ``plot`` (a saved result), ``validate`` and ``estimate`` (a
    spec checked or traced) and ``schema``; listed in ``--help`` after the ones that probe."""
    show = commands.add_parser("show", help="render a saved result (JSON from 'isoprobe run') as a table")
    show.add_argument("result", help="path to a result JSON file")
    show.add_argument("--format", choices=("table", "json", "env", "taskprolog"), default="table")
    plot = commands.add_parser("plot", help="draw a saved result: peak memory and throughput over the batch (PNG)")
    plot.add_argument("result", help="path to a result JSON file")
    plot.add_argument("-o", "--output", help="PNG to write (default: next to the result, .png)")
    validate = commands.add_parser("validate", help="check a spec without running anything")
    _with_overrides(validate)
    estimate = commands.add_parser(
        "estimate",
        help="predict the memory and the maximum from one traced step (no trial, no GPU memory): seconds, not minutes",
        epilog="exit codes: 0 an estimate; 2 bad spec or usage; 4 no estimate (the report "
        "says why: a model the trace cannot follow, a distributed spec)",
    )
    _with_overrides(estimate)
    estimate.add_argument(
        "--format",
        choices=("auto", "json", "table"),
        default="auto",
        help="table for people, json for scripts; auto (default): table on a terminal, else json",
    )
    schema = commands.add_parser("schema", help="print the JSON Schema of the result (or of the spec)")
    which = schema.add_mutually_exclusive_group()
    which.add_argument("--spec", action="store_true", help="the spec's schema instead of the result's")
    which.add_argument("--frontier", action="store_true", help="the schema of 'isoprobe frontier''s document")


def _frontier_parser(commands) -> None:
    """``isoprobe frontier``'s flags (the work is in isoprobe/pipeline/frontier.py)."""
    frontier = commands.add_parser(
        "frontier",
        help="the edge at each value of one field (e.g. sequence lengths): one table, one JSON",
        description="Probe SPEC at every value of --over; each point is a cached probe, the same as "
        "'isoprobe run SPEC --set FIELD=VALUE', and borrows the bounds the points before it proved. "
        "JSON (the FrontierResult) on stdout, the table on stderr.",
        epilog="exit codes: 0 every point answered (or from the cache); 2 bad spec, --over or usage, before any "
        "trial; 3 or 4 the first point without an answer (as 'isoprobe run'), 4 also for a point whose probe "
        "failed before an answer (its error says why; the other points are answered and printed); "
        "130 interrupted, 143 terminated (the points answered so far are printed)",
    )
    _with_overrides(frontier)
    frontier.add_argument(
        "--over",
        required=True,
        action="append",
        metavar="FIELD=V1,V2,...",
        help="the field (as --set names it) and its values, e.g. --over input.shape.0=128,256,512; "
        "once: a frontier varies one field (a second --over is refused)",
    )
    frontier.add_argument(
        "--direction",
        choices=("increasing", "decreasing", "none"),
        help="how memory moves with the value: increasing (default for numbers: a larger value needs more), "
        "decreasing, or none (default otherwise: nothing borrowed between points). Only steers the searches: "
        "every maximum is still run at its own value",
    )
    frontier.add_argument("--no-cache", action="store_true", help="neither read nor write the cache: always probe")
    frontier.add_argument("--refresh", action="store_true", help="probe every point again and replace its answer")


def _sweep_parser(commands) -> None:
    """``isoprobe sweep``'s flags (the work is in isoprobe/sweep/)."""
    sweep = commands.add_parser(
        "sweep",
        help="probe many specs (locally, or as Slurm job arrays on several GPU types): one table, one JSON",
        description="Probe every SPEC (on every --partition/--constraint with --executor slurm); one row per spec "
        "x GPU type. Answers go to the result cache (ISOPROBE_CACHE_DIR: a shared filesystem on a "
        "cluster), so a sweep run again answers from it without probing or submitting.",
        epilog="exit codes: 0 every row answered; 2 bad usage (also --executor slurm without Slurm's commands); "
        "4 a row has no answer (its error says why); 74 --output could not be written (the report still "
        "went to stdout); 130 interrupted, 143 terminated (the sweep's Slurm jobs are cancelled first)",
    )
    sweep.add_argument("specs", nargs="+", metavar="SPEC", help="paths to YAML specs")
    sweep.add_argument(
        "--executor",
        choices=("local", "slurm"),
        default="local",
        help="local (default): one after another on this machine; slurm: one job array per GPU type",
    )
    sweep.add_argument(
        "--format",
        choices=("auto", "json", "table"),
        default="auto",
        help="stdout: table (people), json (the SweepReport), auto: table on a terminal",
    )
    sweep.add_argument("--output", metavar="FILE", help="also write the JSON report to FILE")
    sweep.add_argument("--refresh", action="store_true", help="probe again and replace the cached answers")
    sweep.add_argument("--device", help="override every spec's device")
    sweep.add_argument("--memory-budget", help="override every spec's memory_budget")
    sweep.add_argument("--max-batch-size", help="override every spec's search.max_batch_size")
    sweep.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        dest="set",
        help="override a field of every spec, as 'isoprobe run --set' does; repeatable",
    )
    sweep.add_argument(
        "--over",
        action="append",
        metavar="FIELD=V1,V2,...",
        help="one row per value of the field (as 'isoprobe frontier --over'): the frontier's points, "
        "probed in parallel on Slurm; 'isoprobe frontier' with the same arguments then answers "
        "them from the cache; once (a second --over is refused)",
    )
    _sweep_slurm_flags(sweep)


def _sweep_slurm_flags(sweep) -> None:
    """``isoprobe sweep``'s ``--executor slurm`` group: where and how its job arrays run (sbatch's options). Apart
    from the sweep's own flags because the local executor reads none of them."""
    slurm = sweep.add_argument_group("--executor slurm (submitit; SLURM_CONF and the clients as for sbatch)")
    slurm.add_argument(
        "--partition",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help="a GPU type as a partition; repeatable or comma-separated: one row per spec per partition",
    )
    slurm.add_argument(
        "--constraint",
        action="append",
        default=[],
        metavar="FEATURE[,FEATURE]",
        help="a GPU type as a node feature (sbatch --constraint); repeatable or comma-separated",
    )
    slurm.add_argument("--gpus-per-task", type=_batch_size, metavar="N", help="GPUs per probe (sbatch --gpus-per-task)")
    slurm.add_argument("--cpus-per-task", type=_batch_size, metavar="N", help="CPUs per probe (sbatch --cpus-per-task)")
    slurm.add_argument(
        "--time", type=_batch_size, default=60, metavar="MINUTES", help="time limit per probe (default 60)"
    )
    slurm.add_argument(
        "--array-parallelism",
        type=_batch_size,
        default=16,
        metavar="N",
        help="probes of one array running at once (sbatch --array=...%%N; default 16)",
    )
    slurm.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra sbatch option, e.g. --sbatch account=proj --sbatch qos=short; repeatable",
    )
    slurm.add_argument(
        "--folder",
        default="isoprobe-sweeps",
        metavar="DIR",
        help="the sweep's job files (submitit's pickles, logs, rows): private (made 0700) and on a "
        "filesystem the nodes share (default ./isoprobe-sweeps)",
    )


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``isoprobe run [SPEC] [options] -- COMMAND ...``: isoprobe's own arguments, and the command after the first
    ``--`` (None without one). Split before argparse, which would otherwise read the command's flags as its own."""
    if not argv or argv[0] != "run" or "--" not in argv:
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def _batch_size(text: str) -> int:
    """argparse type for --fallback-batch-size: a whole number >= 1, refused in one short line otherwise."""
    stripped = text.strip()
    if not stripped.isdigit() or len(stripped) > 9 or int(stripped) < 1:
        shown = text if len(text) <= 20 else f"{text[:12]}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"{shown!r} is not a batch size; give a whole number such as 8")
    return int(stripped)


def _command(module: str, name: str):
    """A subcommand's function, imported from ``isoprobe.cli.<module>`` only when it runs."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        return getattr(importlib.import_module(f"isoprobe.cli.{module}"), name)(args)

    run.__name__ = name
    return run


_COMMANDS = {
    "run": _command("run", "cmd_run"),
    "sweep": _command("sweep", "cmd_sweep"),
    "frontier": _command("frontier", "cmd_frontier"),
    "validate": _command("spec", "cmd_validate"),
    "estimate": _command("spec", "cmd_estimate"),
    "schema": _command("spec", "cmd_schema"),
    "show": _command("results", "cmd_show"),
    "plot": _command("results", "cmd_plot"),
}


def entry() -> int:
    """The ``isoprobe`` command: ``main``, behind a tiny init when isoprobe is PID 1 (a container)."""
    from isoprobe.system.pid1 import main_as_pid1

    return main_as_pid1(main)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, command = split_command(argv)
    args = _parser().parse_args(argv)
    args.command_argv = command
    # pydantic looks for plugins in every installed distribution's entry points when it builds its
    # first model: ~0.2 s with torch, transformers and timm installed, which would make a cache hit
    # (a pre-job hook's whole run) twice as slow (measured with benchmarks/studies/cli_startup.py). isoprobe
    # uses no pydantic plugin; a user who wants one can still set the variable themselves.
    import os

    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    # Imported after parsing: --help, --version and usage errors exit inside parse_args
    # and need none of it (errors.py pulls in dataclasses, and with it inspect and ast).
    from isoprobe.errors import ExitCode, OutputFailed, ProbeError, SpecError, Terminated
    from isoprobe.report.streams import detach_stdout, tell

    try:
        return int(_COMMANDS[args.command](args))
    except SpecError as error:
        tell(f"isoprobe: {error.render()}")
        return ExitCode.BAD_SPEC
    except ProbeError as error:
        tell(f"isoprobe: {error.message}")
        if evidence := error.unsaid_evidence():
            tell(evidence)
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
