"""The trial for ``model.hf_trainer``: the user's own Hugging Face ``Trainer``, its ``train()`` for the trial's steps.

The user's function (``f(batch_size, **model.kwargs) -> transformers.Trainer``)
builds their model, ``TrainingArguments``, dataset and collator in this fresh
process; the Trainer's own loop then runs, so what fits is what it allocates
(its precision, accumulation, clipping, optimizer, collator and batches of its
own data). The runner follows ``child.framework.runners``'s contract. On the returned
Trainer it changes only what a trial must differ in from the real job, and
keeps everything that changes memory:

- ``max_steps`` = the hook's most steps, and a callback that stops the loop when
  the hook says so: one trial step is one optimizer step (the Trainer's
  ``on_step_begin`` fires before the first micro-batch of an accumulation,
  ``on_step_end`` after ``optimizer.step()``; transformers 5.24 ``_run_epoch``);
- no saving, logging or reporting (they write files or reach the network); no
  evaluation in a short trial (the real job's evaluation at its own batch is
  ``training.eval_pass``); a trial that decides the maximum (its request has a
  ``cycle``: issue 55) evaluates early where the user's arguments evaluate at all
  (an ``eval_strategy`` other than "no" and one eval set): after the search's
  steps the Trainer evaluates ``EVAL_BATCHES`` batches at its own eval batch,
  inside its training loop (``control.should_evaluate``), as its real first
  evaluation would, and steps on until steady;
  no ``auto_find_batch_size`` (the in-process search this replaces);
- one device, the request's: several visible GPUs would make the Trainer wrap the
  model in DataParallel and split the batch, but the answer is per device;
- kept as the user set them: the dataloader's workers, pinning and prefetching
  (the batches they hold are the real job's), the user's own callbacks.
"""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any

from isoprobe.child.core import cuda as child_cuda
from isoprobe.child.core.memory import cpu_memory
from isoprobe.child.core.step_report import StepHook
from isoprobe.child.core.workload import import_callable
from isoprobe.child.framework.runners import final_readings, framework_cycle
from isoprobe.protocol.messages import MESSAGE_CHARS, EvalDone, InspectProblem, ModelBuilt, TrialRequest
from isoprobe.report import steady
from isoprobe.report.outcomes import Outcome, classify_exception

if TYPE_CHECKING:
    from isoprobe.child.core.step_report import Progress
    from isoprobe.child.events import Events

#: Evaluation batches run with ``training.eval_pass``: the first two, at the Trainer's own eval batch.
EVAL_BATCHES = 2


def run_trainer(request: TrialRequest, events: Events, progress: Progress, torch: Any, device: Any) -> dict[str, Any]:
    """Build the user's Trainer at the request's batch, train it for the trial's steps; the end readings."""
    import transformers

    spec = request.spec
    if spec.model.hf_trainer is None:  # this runner is only ever chosen for an hf_trainer source
        raise ValueError("run_trainer needs model.hf_trainer")
    build = import_callable(spec.model.hf_trainer, request.python_path)
    trainer = build(request.batch_size, **spec.model.kwargs)
    check_trainer(transformers, trainer, request.batch_size, device)
    progress.phase = "model_built"
    events.emit(ModelBuilt(memory=cpu_memory()))
    if device.type == "cuda":
        child_cuda.start_counting(torch, device)  # peaks and retries from here on
    hook = StepHook(torch, device, request, events, progress)
    early = request.cycle is not None and evaluates(transformers, trainer)
    stepper = prepare_for_trial(transformers, trainer, hook, early_after=spec.search.steps if early else None)
    report: dict[str, Any] = {}
    try:
        trainer.train()
        if spec.training.eval_pass:
            progress.phase = "eval"
            report["eval_seconds"] = evaluate(torch, device, trainer)
            events.emit(EvalDone(seconds=report["eval_seconds"]))
    except Exception as exc:
        inner = unwrapped(exc)
        if inner is exc:
            raise
        raise inner from None
    finally:
        del trainer, build
        gc.collect()
    if not stepper.stopped:  # max_steps is the hook's most, so only a loop that ran out of batches ends first
        raise RuntimeError(
            f"the Trainer stopped after {hook.steps_done} optimizer step(s), before the trial's "
            f"{request.steps or spec.search.steps}: its train dataloader ran out of batches"
        )
    report.update(final_readings(torch, device, step_peaks=hook.peaks))
    return report | framework_cycle(request, hook, stepper.evaluated, early, EVAL_BATCHES)


def check_trainer(transformers: Any, trainer: Any, batch_size: int, device: Any) -> None:
    """What the user's function returned must be a Trainer at the asked batch on the trial's device (ValueError);
    ``device`` None: not checked (the environment check, whose process is not the trial's)."""
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(f"model.hf_trainer returned {type(trainer).__name__}, not a transformers.Trainer")
    args = trainer.args
    if args.per_device_train_batch_size != batch_size:
        raise ValueError(
            f"model.hf_trainer was called with batch_size {batch_size} but returned a Trainer whose "
            f"per_device_train_batch_size is {args.per_device_train_batch_size}: pass the function's "
            "batch_size to TrainingArguments(per_device_train_batch_size=...)"
        )
    chosen = args.device if device is not None else None
    if chosen is not None and (
        chosen.type != device.type or (device.type == "cuda" and (chosen.index or 0) != (device.index or 0))
    ):
        raise ValueError(
            f"the Trainer runs on {chosen} but this trial is on {device}: leave the device to "
            "isoprobe (no use_cpu=True for a GPU probe; on several GPUs the trials take cuda:0, or set "
            "CUDA_VISIBLE_DEVICES)"
        )
    samples = train_samples(trainer)  # None: an iterable dataset, and a short one shows as too few steps
    if samples is not None and samples < batch_size and device is not None:  # a backstop: the search stops there
        raise ValueError(
            f"the Trainer's train_dataset has {samples} samples, fewer than the batch {batch_size}: "
            f"set search.max_batch_size: {samples} (no larger batch exists in this data)"
        )


def check_before_trials(spec: Any, python_path: list[str], facts: dict[str, Any]) -> list[InspectProblem]:
    """The environment check's part for ``model.hf_trainer``: build the user's Trainer once, at the search's start
    batch, and refuse before any trial what every trial would refuse (not a Trainer, a batch size not passed on,
    ``training.eval_pass`` without one eval set); ``facts["train_samples"]``: its train set's length, above
    which no batch is tried (the Trainer never draws a larger one). Nothing is trained. An allocation failure
    while building is no spec error: the trials judge memory."""
    import transformers

    batch = spec.search.start_batch_size
    try:
        trainer = import_callable(spec.model.hf_trainer, python_path)(batch, **spec.model.kwargs)
    except Exception as exc:
        if classify_exception([c.__name__ for c in type(exc).__mro__], str(exc)) is Outcome.OUT_OF_MEMORY:
            facts["meta_build_warning"] = f"building the Trainer: {type(exc).__name__}: {str(exc)[:500]}"
            return []
        return [
            InspectProblem(
                stage="hf_trainer",
                type=type(exc).__name__,
                message=f"building the Trainer at batch {batch} raised: {exc}"[:MESSAGE_CHARS],
            )
        ]
    try:
        check_trainer(transformers, trainer, batch, None)
        if spec.training.eval_pass:
            eval_dataset(trainer)
    except ValueError as exc:
        stage = "eval_pass" if spec.training.eval_pass and "eval_dataset" in str(exc) else "hf_trainer"
        return [InspectProblem(stage=stage, type=type(exc).__name__, message=str(exc)[:MESSAGE_CHARS])]
    except TypeError as exc:
        return [InspectProblem(stage="hf_trainer", type=type(exc).__name__, message=str(exc)[:MESSAGE_CHARS])]
    samples = facts["train_samples"] = train_samples(trainer)
    del trainer
    if samples is not None and samples < batch:
        return [
            InspectProblem(
                stage="hf_trainer",
                type="ValueError",
                message=(
                    f"the Trainer's train_dataset holds {samples} samples, fewer than search.start_batch_size "
                    f"{batch}: set search.start_batch_size to at most {samples} (the search stops at {samples}: "
                    "no larger batch exists)"
                ),
            )
        ]
    gc.collect()
    return []


def train_samples(trainer: Any) -> int | None:
    """The length of the Trainer's train set, or None for an iterable one (its length is unknown)."""
    try:
        return len(trainer.train_dataset)
    except TypeError:
        return None


def eval_dataset(trainer: Any) -> Any:
    """The Trainer's one evaluation set (ValueError naming the fix without one, or with a dict of several)."""
    dataset = trainer.eval_dataset
    if dataset is None:
        raise ValueError(
            "training.eval_pass runs the Trainer's evaluate(), but the Trainer model.hf_trainer built has "
            "no eval_dataset: pass eval_dataset=... to the Trainer, or set training.eval_pass: false"
        )
    if isinstance(dataset, dict):
        raise ValueError(
            "training.eval_pass: the Trainer's eval_dataset is a dict of several sets "
            f"({', '.join(map(str, dataset))}); give the Trainer one eval_dataset for the probe"
        )
    return dataset


def evaluates(transformers: Any, trainer: Any) -> bool:
    """Whether the user's Trainer evaluates during its training: an ``eval_strategy`` other than "no", and one eval
    set (read before ``prepare_for_trial`` turns its strategy off)."""
    from transformers.trainer_utils import IntervalStrategy

    dataset = trainer.eval_dataset
    return (
        trainer.args.eval_strategy != IntervalStrategy.NO
        and dataset is not None
        and not isinstance(dataset, dict)
        and hasattr(dataset, "__len__")
    )


def prepare_for_trial(transformers: Any, trainer: Any, hook: StepHook, early_after: int | None = None):
    """The trial's changes to the Trainer's arguments and callbacks (see the module's docstring); the callback
    that steps the hook (its ``stopped`` is True once the hook ended the loop). ``early_after``: evaluate once after
    that many steps, on the first ``EVAL_BATCHES`` batches of the eval set (a trial that decides the maximum)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.trainer_utils import IntervalStrategy, SaveStrategy

    args = trainer.args
    args.max_steps = hook.most_steps
    args.auto_find_batch_size = False
    args.eval_strategy = IntervalStrategy.NO
    args.eval_on_start = False
    args.save_strategy = SaveStrategy.NO
    args.load_best_model_at_end = False
    args.push_to_hub = False
    args.logging_strategy = IntervalStrategy.NO
    args.logging_first_step = False
    args.report_to = []
    args.disable_tqdm = True
    if args.n_gpu > 1:  # one GPU per trial: no DataParallel, and the batch is the device's
        args._n_gpu = 1
        trainer._train_batch_size = args.per_device_train_batch_size
    for callback in list(trainer.callback_handler.callbacks):
        reporting = type(callback).__module__.startswith("transformers.integrations")
        if reporting or isinstance(callback, (PrinterCallback, ProgressCallback)):
            trainer.remove_callback(callback)
    if early_after is not None:
        from torch.utils.data import Subset

        dataset = trainer.eval_dataset
        trainer.eval_dataset = Subset(dataset, range(min(args.eval_batch_size * EVAL_BATCHES, len(dataset))))
        args.max_steps += steady.WINDOW_STEPS  # the steady window after the evaluation too
    stepper = _stepper(transformers, hook, early_after)
    trainer.add_callback(stepper)
    return stepper


def _stepper(transformers: Any, hook: StepHook, early_after: int | None = None):
    """The callback that times and reports each optimizer step, and stops the loop when the hook says so (after
    the early evaluation, where there is one: ``evaluated`` holds the step whose reading first includes it)."""

    class IsoprobeSteps(transformers.TrainerCallback):
        stopped = False
        evaluated: list[int]  # the instance's own list, set below

        def on_step_begin(self, args, state, control, **kwargs):
            hook.begin()

        def on_step_end(self, args, state, control, **kwargs):
            done = hook.after_step()
            if early_after is not None and not self.evaluated and hook.steps_done >= early_after:
                control.should_evaluate = True  # the Trainer evaluates now, inside its loop, then steps on
                return control
            if done and (early_after is None or self.evaluated):
                self.stopped = True
                control.should_training_stop = True
            return control

        def on_evaluate(self, args, state, control, **kwargs):
            if early_after is not None and not self.evaluated:
                self.evaluated.append(hook.steps_done + 1)  # the next step's running peak includes it

    stepper = IsoprobeSteps()
    stepper.evaluated = []
    return stepper


def evaluate(torch: Any, device: Any, trainer: Any) -> float:
    """``trainer.evaluate`` on the first ``EVAL_BATCHES`` batches of its eval set, at the Trainer's eval batch."""
    from torch.utils.data import Subset

    dataset = eval_dataset(trainer)
    size = trainer.args.eval_batch_size * EVAL_BATCHES
    subset = Subset(dataset, range(min(size, len(dataset)))) if hasattr(dataset, "__len__") else dataset
    started = time.perf_counter()
    trainer.evaluate(eval_dataset=subset)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def unwrapped(exc: BaseException) -> BaseException:
    """The out-of-memory error a wrapper's cause chain holds (an accelerate or DataLoader wrapper), else ``exc``."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        names = [cls.__name__ for cls in type(link).__mro__]
        if classify_exception(names, str(link)) is Outcome.OUT_OF_MEMORY:
            return link
        link = link.__cause__
    return exc
