"""``isoprobe run``: the answer for a spec, from the cache or a probe; in hook mode never failing the job."""

from __future__ import annotations

import argparse

from isoprobe.cli.common import COMMAND_LINE_SPEC, budget_overridden, load, render, usage_error, wants_table


def cmd_run(args: argparse.Namespace) -> int:
    import os
    import time

    from isoprobe.pipeline.environment import probe_of_this_trial
    from isoprobe.report.streams import Log, tell
    from isoprobe.system.stops import Stops

    if args.format in ("env", "taskprolog") and (probe := probe_of_this_trial(os.environ)) is not None:
        # A hook (a TaskProlog, a job script's first line) in one of a probe's own trial processes: Slurm runs the
        # TaskProlog for every task of the probe's trial steps too. Probing again would wait for the probe's own
        # lock, and no rank would ever start (issue 56); the trial gives its batch itself.
        tell(
            f"isoprobe: inside a trial of probe {probe} (ISOPROBE_TRIAL is set): a hook does nothing here; the "
            "trial sets the batch"
        )
        return 0

    started = time.monotonic()

    # SIGINT/SIGTERM: the first stops the probe (the trials so far are printed, exit 130/143); any later one,
    # and one that comes once the result is complete, waits: it must not cut the cleanup or the document.
    stops = Stops().install()
    if args.fallback_batch_size is not None and args.format not in ("env", "taskprolog"):
        usage_error(
            "--fallback-batch-size needs --format env or --format taskprolog (a job reads the fallback "
            "from ISOPROBE_BATCH_SIZE)"
        )
    try:
        log = Log(args.log)
    except OSError as exc:
        if args.fallback_batch_size is None:  # found before anything ran: the command line is wrong
            usage_error(f"--log {args.log}: {exc.strerror or exc}")
        tell(f"isoprobe: --log {args.log}: cannot open ({exc.strerror or exc}); running without the log")
        log = Log(None)  # in hook mode a log is never worth the job
    try:
        if args.fallback_batch_size is None:
            return _run_and_print(args, log, stops, started)
        return _run_as_hook(args, log, stops, started)
    finally:
        log.close()
        stops.done()


def _run_and_print(args: argparse.Namespace, log, stops, started: float) -> int:
    from isoprobe.report.outcomes import StopReason
    from isoprobe.report.output import summary_lines
    from isoprobe.report.result import exit_code_for
    from isoprobe.report.streams import emit

    ended = _ended(args, log, started, hook=False)
    result = ended.result
    stops.hold()  # the result is complete (or holds the trials so far): a signal now must not cut it short
    log.write(render(result, "json"))  # first: if stdout then fails (exit 74), the log still holds the answer
    for line in ended.said:  # an error's own words first: they are what a person needs, even if stdout fails
        log.say(line)
    if not (result.stop_reason is StopReason.BAD_SPEC and wants_table(args.format)):  # a person has it on stderr
        emit(render(result, args.format))
    if not ended.said:
        for line in summary_lines(result):
            log.say(line)
    return exit_code_for(result.stop_reason)


def _run_as_hook(args: argparse.Namespace, log, stops, started: float) -> int:
    """Hook mode: never fail the job because the probe could not answer; the fallback and a warning instead.

    Whatever goes wrong before the answer (the spec, a trial, the cache, the log,
    no space for a trial's files, a bug in isoprobe) ends in the fallback and exit
    0. The one failure no fallback can cover is stdout itself: then the job gets
    nothing to read, and exit 74 (``OutputFailed``, raised by ``emit``) says so.
    A signal is no failure to cover: the stop's variables (``ISOPROBE_ANSWERED=0``,
    ``ISOPROBE_STOP_REASON=terminated``) and exit 130/143, as without a fallback.
    """
    from isoprobe.errors import ExitCode, OutputFailed
    from isoprobe.report.outcomes import StopReason
    from isoprobe.report.result import exit_code_for
    from isoprobe.report.shell import fallback_variables
    from isoprobe.report.shell import render as render_shell
    from isoprobe.report.streams import emit

    ended = _ended(args, log, started, hook=True)
    result = ended.result
    stops.hold()  # the result is complete (or holds the trials so far), or the fallback is the job's answer now
    log.write(render(result, "json"))
    usable = result.answered and result.recommended_batch_size is not None
    if usable or result.stop_reason in (StopReason.INTERRUPTED, StopReason.TERMINATED):
        for line in ended.said:
            log.say(line)
        emit(render(result, args.format))
        return exit_code_for(result.stop_reason)
    # No answer, or answered but nothing recommended (no batch survived its soak): the job still needs a batch size.
    reason = result.stop_reason.value if not result.answered else "no_recommendation"
    warning = f"no probed answer ({result.message}); using the fallback batch size {args.fallback_batch_size}"
    log.say(f"isoprobe: {warning}")
    try:
        emit(
            render_shell(fallback_variables(args.fallback_batch_size, reason), [warning], args.format),
            what="the fallback batch size to stdout (the job gets no ISOPROBE_BATCH_SIZE)",
        )
    except OutputFailed as error:
        log.write(f"isoprobe: {error}")  # main says it on stderr and exits 74
        raise
    return ExitCode.ANSWERED


class _Ended:
    """How the run ended: its ``Result`` (the probe's, or a stop's: ``report.stop``), and, for a stop the probe
    gave no result for, the lines that say it on stderr in place of the summary."""

    def __init__(self, result, said: list[str] | None = None):
        self.result = result
        self.said = said or []


def _ended(args: argparse.Namespace, log, started: float, *, hook: bool) -> _Ended:
    """The probe's result, or a stop's document for what ended the run before or outside it (issue 56: every stop
    prints one): a bad spec (``bad_spec``, exit 2), a ``ProbeError`` (``error``, exit 4, with the trials it had
    run), a signal before the first trial (130/143), a bug in isoprobe (``internal_error``, exit 1; its traceback
    on stderr, in hook mode in the log only). A usage error (``SystemExit``) passes: stderr only."""
    import time
    import traceback

    from isoprobe.errors import ProbeError, SpecError, Terminated
    from isoprobe.report.outcomes import StopReason
    from isoprobe.report.stop import stop_result

    def stop(reason: StopReason, message: str, said: list[str], trials=()) -> _Ended:
        seconds = 0.0 if reason is StopReason.BAD_SPEC else time.monotonic() - started  # bad_spec: no probe ran
        return _Ended(
            stop_result(
                reason,
                message,
                spec_path=args.spec or COMMAND_LINE_SPEC,
                spec=getattr(args, "loaded_spec", None),
                trials=trials,
                seconds=seconds,
            ),
            said,
        )

    try:
        return _Ended(_result_for(args, log))
    except SpecError as error:
        return stop(StopReason.BAD_SPEC, error.render(), [] if hook else [f"isoprobe: {error.render()}"])
    except ProbeError as error:
        evidence = error.unsaid_evidence()
        if hook and evidence:  # the fallback's warning says the message
            log.write(evidence)
        said = [] if hook else [f"isoprobe: {error.message}", *([evidence] if evidence else [])]
        return stop(StopReason.ERROR, error.message, said, error.trials)
    except (KeyboardInterrupt, Terminated) as stopped:
        from isoprobe.system.slurm_job import signal_stop

        name, reason = (
            ("SIGINT", StopReason.INTERRUPTED)
            if isinstance(stopped, KeyboardInterrupt)
            else ("SIGTERM", StopReason.TERMINATED)
        )
        start, end = signal_stop(name, "before the first trial")
        return stop(reason, start + end, [f"isoprobe: {start + end}"])
    except Exception as error:  # a bug in isoprobe: its traceback for whoever fixes it, and still the document
        message = f"internal error: {type(error).__name__}: {error}"
        if hook:  # the fallback's warning says the message; the traceback goes where nobody's job reads it
            log.write(traceback.format_exc())
            return stop(StopReason.INTERNAL_ERROR, message, [])
        return stop(StopReason.INTERNAL_ERROR, message, [traceback.format_exc().rstrip(), f"isoprobe: {message}"])


def _result_for(args: argparse.Namespace, log):
    """The result for the spec: from the cache when it holds the answer, else from a probe (then stored).

    The same path as the Python API's ``probe()`` (``api.answer_for``): cache ->
    lock -> probe -> store, an ``OSError`` turned into one line (``ProbeError``).
    The valid spec is kept as ``args.loaded_spec``: a stop after it names it in its document.
    """
    from isoprobe.api import answer_for

    spec = args.loaded_spec = load(args)
    return answer_for(
        spec,
        args.spec,
        log.say,
        use_cache=not args.no_cache,
        refresh=args.refresh,
        budget_source="command line" if budget_overridden(args) else "spec",
    )
