"""``isoprobe show`` and ``plot``: a saved result rendered again (every view from the one Result model)."""

from __future__ import annotations

import argparse

from isoprobe.cli.common import read_result, render


def cmd_show(args: argparse.Namespace) -> int:
    from isoprobe.errors import ExitCode
    from isoprobe.report.streams import emit

    emit(render(read_result(args.result), args.format))
    return ExitCode.ANSWERED


def cmd_plot(args: argparse.Namespace) -> int:
    from isoprobe.errors import OutputFailed, Problem, SpecError

    result = read_result(args.result, frontier=True)  # a clear error for a file that is not one, before matplotlib
    from isoprobe.report.plot import PlotUnavailable, default_output, main_plot

    try:
        if hasattr(result, "points"):  # isoprobe frontier's document: the maximum over the field's values
            from isoprobe.report.frontier_plot import render_frontier
            from isoprobe.report.streams import tell

            tell(f"isoprobe: wrote {render_frontier(result, args.output or default_output(args.result))}")
            return 0
        return main_plot(args.result, args.output, result=result)
    except PlotUnavailable as exc:
        raise SpecError(args.result, [Problem("", str(exc), "pip install 'isoprobe[plot]'")]) from None
    except OSError as exc:  # the PNG could not be written: a full disk, a folder that is not there
        raise OutputFailed(f"the plot {args.output or default_output(args.result)}", exc.strerror or str(exc)) from None
