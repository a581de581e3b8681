"""``isoprobe sweep``: many specs, one table and one JSON report (the work is in ``isoprobe.sweep``)."""

from __future__ import annotations

import argparse

from isoprobe.cli.common import named_overrides, single_over, usage_error, wants_table


def cmd_sweep(args: argparse.Namespace) -> int:
    """Probe many specs; the table or JSON on stdout, progress on stderr."""
    from isoprobe.system.stops import Stops

    targets = [f"partition={name}" for text in args.partition for name in text.split(",") if name.strip()]
    targets += [f"constraint={name}" for text in args.constraint for name in text.split(",") if name.strip()]
    if bad := [text for text in args.sbatch if "=" not in text or not text.partition("=")[0].strip()]:
        usage_error(f"--sbatch {bad[0]!r}: give KEY=VALUE, e.g. --sbatch account=myproject", "sweep")
    sbatch = dict(text.split("=", 1) for text in args.sbatch)
    if args.executor == "slurm" and not targets:
        usage_error("sweep --executor slurm needs at least one --partition or --constraint (a GPU type)", "sweep")
    if args.executor == "local" and (targets or sbatch):
        usage_error("--partition, --constraint and --sbatch are for --executor slurm", "sweep")
    if args.executor == "slurm":
        from isoprobe.sweep.slurm import missing_commands

        if missing := missing_commands():  # before any spec is probed on the login node
            usage_error(
                f"--executor slurm needs Slurm's client commands on PATH, and {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not there: run it on a Slurm login node (or "
                "module load slurm), or use --executor local",
                "sweep",
            )
    over = None
    over_text = single_over(args.over, "sweep")  # two --over: exit 2 (a sweep varies one field, as a frontier does)
    if over_text is not None:  # a frontier's points as rows: each the cache entry 'isoprobe frontier' then reads
        import json

        from isoprobe.spec.overrides import parse_over

        field, values = parse_over(over_text, args.specs[0])
        over = [f"{field}={json.dumps(value)}" for value in values]
    # SIGINT/SIGTERM: the first stops the sweep (its Slurm arrays cancelled, the rows so far printed); a later one
    # waits, so that it cannot cut the cancelling or the report short (system.stops).
    stops = Stops().install()
    try:
        return _sweep_and_print(args, stops, targets, sbatch, over)
    finally:
        stops.done()


def _sweep_and_print(args: argparse.Namespace, stops, targets: list[str], sbatch: dict, over) -> int:
    from pathlib import Path

    from isoprobe.errors import ExitCode, OutputFailed
    from isoprobe.report.streams import emit, tell
    from isoprobe.sweep import run_sweep
    from isoprobe.sweep.model import render_sweep_table
    from isoprobe.sweep.slurm import SlurmOptions

    options = SlurmOptions(
        folder=Path(args.folder).resolve(),
        gpus_per_task=args.gpus_per_task,
        cpus_per_task=args.cpus_per_task,
        time_minutes=args.time,
        array_parallelism=args.array_parallelism,
        sbatch=sbatch,
    )
    report = run_sweep(
        args.specs,
        executor=args.executor,
        say=tell,
        targets=targets,
        named=named_overrides(args),
        sets=tuple(args.set),
        refresh=args.refresh,
        slurm_options=options,
        over=over,
    )
    stops.hold()  # the report holds every row: a signal now must not cut it short
    document = report.model_dump_json(indent=2)
    unwritten = None
    if args.output:
        try:
            Path(args.output).write_text(document + "\n")
        except OSError as exc:  # a full disk, a missing folder: the report still goes to stdout, and the code says so
            unwritten = exc.strerror or str(exc)
    emit(render_sweep_table(report) if wants_table(args.format) else document)
    if report.interrupted:
        return ExitCode.INTERRUPTED if report.interrupted == "interrupted" else ExitCode.TERMINATED
    if unwritten is not None:  # a script that reads the file must not go on as if it were there: exit 74
        raise OutputFailed(f"the report --output {args.output}", unwritten)
    return ExitCode.ANSWERED if report.all_answered else ExitCode.NO_ANSWER
