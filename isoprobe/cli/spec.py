"""``isoprobe validate``, ``estimate`` and ``schema``: a spec read and checked, or a contract printed; no trial."""

from __future__ import annotations

import argparse

from isoprobe.cli.common import budget_overridden, load, wants_table


def cmd_validate(args: argparse.Namespace) -> int:
    from isoprobe.errors import ExitCode
    from isoprobe.report.streams import emit

    spec = load(args)
    if spec.command is not None:  # the script builds, feeds and steps its model: nothing of isoprobe's sections
        where = "$ISOPROBE_BATCH_SIZE" if spec.batch_from == "env" else "{batch_size}"
        emit(f"{args.spec}: valid ({spec.workload}, the batch in {where}, device {spec.device})")
        return ExitCode.ANSWERED
    source = spec.model.source
    inputs = f"input {spec.input.shape}" if spec.input is not None else f"batch {spec.model.batch}"
    if spec.data is not None:
        inputs = f"data {spec.data.dataset} (the longest samples)"
    task = spec.target.resolved_task if spec.target is not None else f"loss {spec.model.loss or 'of the model'}"
    step = f", the step {spec.model.step}" if spec.model.step else ""
    if spec.model.hf_trainer is not None:  # the user's Trainer brings its data, loss, optimizer and precision
        evaluation = ", with an evaluation pass" if spec.training.eval_pass else ""
        emit(
            f"{args.spec}: valid (hf_trainer {spec.model.hf_trainer}: your Trainer's own loop{evaluation}, "
            f"device {spec.device})"
        )
        return ExitCode.ANSWERED
    if spec.model.lightning is not None:  # the module's own loader, step and optimizer: none of isoprobe's sections
        data = f" with {spec.model.datamodule}" if spec.model.datamodule else ""
        inputs, task, step = f"its train_dataloader(){data}", "its training_step", ", under trainer.fit"
    ranks = spec.distributed.world_size or "the job's or node's"
    distributed = (
        f", {spec.distributed.strategy} over {ranks} ranks (batches per rank)" if spec.distributed.gang else ""
    )
    emit(
        f"{args.spec}: valid ({source} model {getattr(spec.model, source)}, {inputs}, {task}, "
        f"{spec.training.mode} {spec.training.precision}{step}, optimizer "
        f"{'configure_optimizers()' if spec.model.lightning else spec.optimizer.name}, device {spec.device}"
        f"{distributed})"
    )
    return ExitCode.ANSWERED


def cmd_estimate(args: argparse.Namespace) -> int:
    """The traced estimate alone: the environment check's child, no trial (isoprobe.pipeline.estimate)."""
    from isoprobe.errors import ExitCode
    from isoprobe.pipeline.estimate import estimate_spec
    from isoprobe.pipeline.prediction import no_estimate, render_report
    from isoprobe.report.streams import emit, tell

    report = estimate_spec(load(args), args.spec, "command line" if budget_overridden(args) else "spec")
    emit(render_report(report) if wants_table(args.format) else report.model_dump_json(indent=2))
    if report.estimate.per_sample_bytes is None:
        # The command's one job is the estimate: without one (a model the trace cannot follow, a trace that
        # ran out of time, a distributed spec) the report says why, and the exit code must not say "answered".
        tell(f"isoprobe estimate: {no_estimate(report.estimate)}; 'isoprobe run' measures the answer without one")
        return ExitCode.NO_ANSWER
    return ExitCode.ANSWERED


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from isoprobe.errors import ExitCode
    from isoprobe.report.streams import emit

    if args.spec:  # only the model asked for is imported: the result module (and its models) costs time
        from isoprobe.spec.model import Spec

        emit(json.dumps(Spec.model_json_schema(), indent=2))
    elif args.frontier:
        from isoprobe.report.frontier import FrontierResult

        emit(json.dumps(FrontierResult.model_json_schema(), indent=2))
    else:
        from isoprobe.report.result import Result

        emit(json.dumps(Result.model_json_schema(), indent=2))
    return ExitCode.ANSWERED
