"""``isoprobe run``: the answer for a spec, from the cache or a probe; in hook mode never failing the job."""

from __future__ import annotations

import argparse

from isoprobe.cli.common import budget_overridden, load, render, usage_error


def cmd_run(args: argparse.Namespace) -> int:
    from isoprobe.report.streams import Log, tell
    from isoprobe.system.stops import Stops

    # SIGINT/SIGTERM: the first stops the probe (the trials so far are printed, exit 130/143); any later one,
    # and one that comes once the result is complete, waits: it must not cut the cleanup or the document.
    stops = Stops().install()
    if args.fallback_batch_size is not None and args.format not in ("env", "taskprolog"):
        usage_error("--fallback-batch-size needs --format env or --format taskprolog (a job reads the fallback "
                    "from ISOPROBE_BATCH_SIZE)")
    try:
        log = Log(args.log)
    except OSError as exc:
        if args.fallback_batch_size is None:  # found before anything ran: the command line is wrong
            usage_error(f"--log {args.log}: {exc.strerror or exc}")
        tell(f"isoprobe: --log {args.log}: cannot open ({exc.strerror or exc}); running without the log")
        log = Log(None)  # in hook mode a log is never worth the job
    try:
        if args.fallback_batch_size is None:
            return _run_and_print(args, log, stops)
        return _run_as_hook(args, log, stops)
    finally:
        log.close()
        stops.done()


def _run_and_print(args: argparse.Namespace, log, stops) -> int:
    from isoprobe.report.output import summary_lines
    from isoprobe.report.result import exit_code_for
    from isoprobe.report.streams import emit

    result = _result_for(args, log)
    stops.hold()  # the result is complete (or holds the trials so far): a signal now must not cut it short
    log.write(render(result, "json"))  # first: if stdout then fails (exit 74), the log still holds the answer
    emit(render(result, args.format))
    for line in summary_lines(result):
        log.say(line)
    return exit_code_for(result.stop_reason)


def _run_as_hook(args: argparse.Namespace, log, stops) -> int:
    """Hook mode: never fail the job because the probe could not answer; the fallback and a warning instead.

    Whatever goes wrong before the answer (the spec, a trial, the cache, the log,
    no space for a trial's files, a bug in isoprobe) ends in the fallback and exit
    0. The one failure no fallback can cover is stdout itself: then the job gets
    nothing to read, and exit 74 (``OutputFailed``, raised by ``emit``) says so.
    """
    import traceback

    from isoprobe.errors import ExitCode, OutputFailed, ProbeError, SpecError
    from isoprobe.report.outcomes import StopReason
    from isoprobe.report.result import exit_code_for
    from isoprobe.report.shell import fallback_variables, render as render_shell
    from isoprobe.report.streams import emit

    try:
        result = _result_for(args, log)
    except SpecError as error:
        reason, why = "bad_spec", error.render()
    except ProbeError as error:
        reason, why = "error", error.message
        if evidence := error.unsaid_evidence():  # the warning below says the message
            log.write(evidence)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:  # a bug in isoprobe must not stop the job either; the traceback goes to the log
        log.write(traceback.format_exc())
        reason, why = "internal_error", f"{type(error).__name__}: {error}"
    else:
        stops.hold()  # the result is complete (or holds the trials so far): a signal now must not cut it short
        log.write(render(result, "json"))
        usable = result.answered and result.recommended_batch_size is not None
        if usable or result.stop_reason in (StopReason.INTERRUPTED, StopReason.TERMINATED):
            emit(render(result, args.format))
            return exit_code_for(result.stop_reason)
        # Answered but nothing recommended (no batch survived its soak): the job still needs a batch size.
        reason = result.stop_reason.value if not result.answered else "no_recommendation"
        why = result.message
    stops.hold()  # the fallback is the job's answer now: a signal must not cut it short either
    warning = f"no probed answer ({why}); using the fallback batch size {args.fallback_batch_size}"
    log.say(f"isoprobe: {warning}")
    try:
        emit(render_shell(fallback_variables(args.fallback_batch_size, reason), [warning], args.format),
             what="the fallback batch size to stdout (the job gets no ISOPROBE_BATCH_SIZE)")
    except OutputFailed as error:
        log.write(f"isoprobe: {error}")  # main says it on stderr and exits 74
        raise
    return ExitCode.ANSWERED


def _result_for(args: argparse.Namespace, log):
    """The result for the spec: from the cache when it holds the answer, else from a probe (then stored).

    The same path as the Python API's ``probe()`` (``api.answer_for``): cache ->
    lock -> probe -> store, an ``OSError`` turned into one line (``ProbeError``).
    """
    from isoprobe.api import answer_for

    spec = load(args)
    return answer_for(spec, args.spec, log.say, use_cache=not args.no_cache, refresh=args.refresh,
                      budget_source="command line" if budget_overridden(args) else "spec")
