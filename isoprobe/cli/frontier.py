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
    import signal

    from isoprobe.api import answer_for
    from isoprobe.errors import ExitCode, Terminated
    from isoprobe.pipeline.frontier import run_frontier
    from isoprobe.report.frontier import frontier_table
    from isoprobe.report.output import Reporter
    from isoprobe.report.result import exit_code_for
    from isoprobe.report.streams import emit, tell

    from isoprobe.cli.common import budget_overridden

    def on_sigterm(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    plan = frontier_plan(args)
    budget_source = "command line" if budget_overridden(args) else "spec"

    def answer_point(spec, borrowed):
        return answer_for(spec, args.spec, tell, use_cache=not args.no_cache, refresh=args.refresh,
                          budget_source=budget_source, borrowed=borrowed)

    result = run_frontier(plan, Reporter(tell), answer_point)
    tell(frontier_table(result))
    emit(result.model_dump_json(indent=2))
    # The first point without an answer says why, as 'isoprobe run' would (an interrupted point: 130 or 143).
    unanswered = [p.result for p in result.points if not p.result.answered]
    return exit_code_for(unanswered[0].stop_reason) if unanswered else ExitCode.ANSWERED


def frontier_plan(args: argparse.Namespace):
    """The spec validated at every value of --over (every problem of every value at once, exit 2), and the direction."""
    from isoprobe.cli.common import named_overrides
    from isoprobe.errors import Problem, SpecError
    from isoprobe.pipeline.frontier import FrontierPlan, resolve_direction
    from isoprobe.spec.load import check_references, load_spec
    from isoprobe.spec.overrides import Override, from_mapping, parse_over, shortened

    field, values = parse_over(args.over, args.spec)
    specs, problems = [], []
    for value in values:
        # After every --set (the --over field wins over a --set of it), before the named flags (which win for theirs).
        given = [Override(field, value, f"--over {field}={shortened(repr(value))}"),
                 *from_mapping(named_overrides(args))]
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
        raise SpecError(args.spec, [Problem(f"{field} (from --over)", str(exc),
                                            "give numbers, or --direction none to borrow nothing between points")])
    return FrontierPlan(args.spec, field, values, specs, direction)
