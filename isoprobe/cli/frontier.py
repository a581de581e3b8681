"""``isoprobe frontier``: the edge at each value of one field (a sequence length, an image size), as one document.

The values come from ``--over FIELD=V1,V2,...`` (``spec.overrides.parse_over``);
every value is validated as ``--set FIELD=VALUE`` would be, all of them before
any trial (a bad one: exit 2, naming the field). Each point is then an ordinary
cached answer (``pipeline.frontier``). The ``FrontierResult`` goes to stdout as
JSON, the table to stderr.
"""

from __future__ import annotations

import argparse


def cmd_frontier(args: argparse.Namespace) -> int:
    from isoprobe.api import answer_for
    from isoprobe.cli.common import budget_overridden
    from isoprobe.pipeline.frontier import run_frontier
    from isoprobe.report.frontier import frontier_table
    from isoprobe.report.output import Reporter
    from isoprobe.report.streams import emit, tell
    from isoprobe.system.stops import Stops

    # SIGINT/SIGTERM: the first stops the point being probed (its trials so far are kept) and the frontier with it;
    # any later one, and one between two points or while the document is printed, waits (system.stops).
    stops = Stops().install()
    try:
        plan = frontier_plan(args)
        budget_source = "command line" if budget_overridden(args) else "spec"

        def answer_point(spec, borrowed):
            stops.arm()  # this point's probe may be stopped; between points a signal is noted, then ends the frontier
            try:
                return answer_for(
                    spec,
                    args.spec,
                    tell,
                    use_cache=not args.no_cache,
                    refresh=args.refresh,
                    budget_source=budget_source,
                    borrowed=borrowed,
                )
            finally:
                stops.hold()

        stops.hold()
        result = run_frontier(plan, Reporter(tell), answer_point, stopped=lambda: stops.reason)
        tell(frontier_table(result))
        emit(result.model_dump_json(indent=2))
        return frontier_exit_code(result)
    finally:
        stops.done()


def frontier_exit_code(result) -> int:
    """130/143 when a signal stopped the frontier; 0 when every point has an answer; else the code of the first
    point (in --over order) without one: its result's, as 'isoprobe run' gives it (3: not even the start batch
    fits there; 4: no answer), or 4 for a point whose probe failed before a result (its ``error`` says why)."""
    from isoprobe.errors import ExitCode
    from isoprobe.report.outcomes import StopReason
    from isoprobe.report.result import exit_code_for

    if result.interrupted is not None:
        return exit_code_for(StopReason(result.interrupted))
    unanswered = [p for p in result.points if not p.answered]
    if not unanswered:
        return ExitCode.ANSWERED
    first = unanswered[0]
    return exit_code_for(first.result.stop_reason) if first.result is not None else ExitCode.NO_ANSWER


def frontier_plan(args: argparse.Namespace):
    """The spec validated at every value of --over (every problem of every value at once, exit 2), and the direction."""
    from isoprobe.cli.common import named_overrides, single_over
    from isoprobe.errors import Problem, SpecError
    from isoprobe.pipeline.frontier import FrontierPlan, resolve_direction
    from isoprobe.spec.load import check_references, load_spec
    from isoprobe.spec.overrides import Override, from_mapping, parse_over, shortened

    over = single_over(args.over, "frontier")
    assert over is not None, "the frontier's parser requires --over"
    field, values = parse_over(over, args.spec)
    specs, problems = [], []
    for value in values:
        # After every --set (the --over field wins over a --set of it), before the named flags (which win for theirs).
        given = [
            Override(field, value, f"--over {field}={shortened(repr(value))}"),
            *from_mapping(named_overrides(args)),
        ]
        try:
            spec = load_spec(args.spec, given, sets=args.set)
            check_references(spec, args.spec)
        except SpecError as error:
            problems += [p for p in error.problems if p not in problems]
            continue
        specs.append(spec)
    if problems:
        raise SpecError(args.spec, problems)
    try:
        direction = resolve_direction(values, args.direction)
    except ValueError as exc:
        raise SpecError(
            args.spec,
            [
                Problem(
                    f"{field} (from --over)",
                    str(exc),
                    "give numbers, or --direction none to borrow nothing between points",
                )
            ],
        ) from exc
    return FrontierPlan(args.spec, field, values, specs, direction)
