"""The hostile-spec corpus: every file in tests/bad_specs/, the exact message it must produce, and how a refusal looks.

Read by tests/cli/test_bad_specs.py (the static ones, ``isoprobe validate`` in this process, and the corpus's
completeness) and tests/integration/test_bad_specs_run.py (the ``run-*`` ones, refused by ``isoprobe run``'s
inspect child before any trial).
"""

from __future__ import annotations

from pathlib import Path

BAD = Path(__file__).resolve().parents[1] / "bad_specs"

# file, the message's first line after "isoprobe: FILE: " ({here} is BAD), start of the fix (None: no fix line)
STATIC = [
    ('a-directory.yaml', 'is a directory, not a spec file', 'give the path of a .yaml file'),
    ('bad-device.yaml', "device: 'gpu' is not a device", 'use auto, cpu, cuda or cuda:N'),
    ('empty-model-name.yaml', 'model.torchvision: String should have at least 1 character', 'Name of a torchvision model, as accepted'),
    ('empty.yaml', 'the file is empty', 'see specs/ for examples'),
    ('data-with-input.yaml', 'input: with data, every batch comes from data.dataset (its longest samples); remove input', None),
    ('data-with-model-batch.yaml', 'model.batch: with data, every batch comes from data.dataset; give one of them', None),
    ('data-function-missing.yaml', "data.dataset: bad_data.py defines no 'token_datset'", "did you mean 'token_dataset'?"),
    ('factory-file-missing.yaml', 'model.factory: no such file: {here}/missing_models.py', "paths are relative to the spec file's fo"),
    ('factory-function-missing.yaml', "model.factory: helpers.py defines no 'biuld_model'", "did you mean 'build_model'?"),
    ('factory-malformed.yaml', "model: factory 'helpers.build_model' must look like 'package.module:function' or 'file.py:function'", None),
    ('factory-module-missing.yaml', "model.factory: no module named 'no_such_package' on the import path", 'install it, or put it next to the spec, '),
    ('factory-syntax-error.yaml', 'model.factory: {here}/broken_syntax.py line 1: invalid syntax', 'fix the Python syntax'),
    ('headroom-too-large.yaml', 'recommendation.headroom: 1.5 is neither a fraction in [0, 1) nor a whole number of bytes', 'Memory to keep free below the capacity: '),
    ('huge-budget.yaml', "memory_budget: '2000TiB' is more than 1 PiB: not a memory size", "Memory the trial may use, e.g. '8GiB', '"),
    ('huge-shape.yaml', 'input: one sample of shape [100000, 100000, 100] has 1000000000000 elements: far beyond any real input', None),
    ('huge-start.yaml', 'search.start_batch_size: Input should be less than or equal to 16777216', 'First batch tried. 2 by default: BatchNo'),
    ('int-input-without-high.yaml', "input: dtype int64 needs 'high' (inputs are drawn from [0, high))", None),
    ('missing-model-name.yaml', "model: give exactly one of 'torchvision' (a model name), 'timm' (a model name), 'huggingface' (a model type), 'factory' ('module:function'), 'hf_trainer' ('module:function' building a transformers.Trainer) or 'lightning' ('module:LightningModuleClass')", None),
    ('negative-budget.yaml', "memory_budget: cannot read '-1GiB' as a size; write e.g. '8GiB', '16 GB', '512MiB' or a number of bytes", "Memory the trial may use, e.g. '8GiB', '"),
    ('negative-max.yaml', 'search.max_batch_size: Input should be greater than or equal to 1', 'Never try a batch above this.'),
    ('negative-timeout.yaml', 'search.trial_timeout: Input should be greater than 0', 'Seconds one trial may take from the mome'),
    ('non-utf8.yaml', 'not UTF-8 text (byte 0xe9 at offset 56)', 'save the spec as UTF-8'),
    ('one-step.yaml', 'search.steps: Input should be greater than or equal to 2', 'Training steps per trial (at least 2: Ad'),
    ('only-comments.yaml', 'the file is empty', 'see specs/ for examples'),
    ('step-function-missing.yaml', "model.step: helpers.py defines no 'train_stp'", "did you mean 'train_step'?"),
    ('step-in-inference.yaml', 'training: mode inference runs no training step; model.step needs mode train', None),
    ('step-with-loss.yaml', 'model: model.step computes its own loss; give model.step or model.loss, not both', None),
    ('step-with-mixed-precision.yaml', "training: precision fp16-mixed autocasts isoprobe's own step; with model.step, autocast (and scale) inside your step and set training.precision to fp32 (or bf16-true, which converts the model)", None),
    ('output-lifetime-unknown.yaml', "training.output_lifetime: Input should be 'through_backward' or 'freed_before_backward'", "use one of 'through_backward' or 'freed_"),
    ('negative-soak.yaml', 'recommendation.soak_steps: Input should be greater than or equal to 0', 'Steps the recommended batch runs in a fr'),
    ('start-above-dataset.yaml', 'search: start_batch_size 16 is above dataset_size 8', None),
    ('start-above-max.yaml', 'search: start_batch_size 64 is above max_batch_size 32', None),
    ('top-level-list.yaml', 'the spec must be a YAML mapping, got list', 'see specs/ for examples'),
    ('top-level-scalar.yaml', 'the spec must be a YAML mapping, got str', 'see specs/ for examples'),
    ('two-model-sources.yaml', "model: give exactly one of 'torchvision' (a model name), 'timm' (a model name), 'huggingface' (a model type), 'factory' ('module:function'), 'hf_trainer' ('module:function' building a transformers.Trainer) or 'lightning' ('module:LightningModuleClass')", None),
    ('two-targets.yaml', "target: give exactly one of 'classes' (classification, segmentation, detection) or 'shape' (regression)", None),
    ('unknown-nested-key.yaml', "search.max_batch: unknown field 'max_batch'", "did you mean 'max_batch_size'? known fie"),
    ('unknown-optimizer.yaml', "optimizer.name: Input should be 'sgd', 'adam' or 'adamw'", "use one of 'sgd', 'adam' or 'adamw'"),
    ('unknown-top-level-key.yaml', "optimzer: unknown field 'optimzer'", "did you mean 'optimizer'? known fields h"),
    ('unknown-torchvision-model.yaml', "model.torchvision: torchvision has no model named 'resnet5O'", "did you mean 'resnet50' or 'resnet152' o"),
    ('unreadable-budget.yaml', "memory_budget: cannot read 'lots' as a size; write e.g. '8GiB', '16 GB', '512MiB' or a number of bytes", "Memory the trial may use, e.g. '8GiB', '"),
    ('wrong-type-model.yaml', "model: expected a mapping of fields here, got str 'resnet18'", 'known fields here: torchvision, timm, hug'),
    ('wrong-type-shape.yaml', 'input.shape: Input should be a valid list', 'Per-sample input shape without the batch'),
    ('wrong-type-steps.yaml', 'search.steps: Input should be a valid integer', 'Training steps per trial (at least 2: Ad'),
    ('yaml-alias-bomb.yaml', 'expands to more than 10000 values (YAML aliases?)', 'write the spec out plainly; it needs a f'),
    ('yaml-bad-indent.yaml', 'line 3, column 10: not valid YAML: mapping values are not allowed here', 'fix the YAML syntax at that place'),
    # Refused where the 33rd level opens (line 1, column 39), not after scanning all 10,000: PyYAML's scanner
    # is quadratic in the depth, and the old refusal (a RecursionError) came only after seconds of it.
    ('yaml-deep-nesting.yaml', 'line 1, column 39: nested too deeply to be a spec (more than 32 levels)', 'a spec needs a few levels; look for br'),
    ('yaml-explicit-tag-unreadable.yaml', "search.steps: cannot read '12abc': invalid literal for int() with base 10: '12abc'", 'write plain values: numbers, text, list'),
    ('yaml-binary-value.yaml', "model.kwargs.weights: YAML's !!binary makes a value that a spec cannot hold", 'write plain values: numbers, text, list'),
    ('int-with-5000-digits.yaml', 'search.steps: a number with 5000 digits is far beyond any value a spec takes', "a spec's numbers are batch sizes, steps"),
    ('budget-with-400-zeros.yaml', "memory_budget: '10000000000000000000000000000... (406 characters) is more than 1 PiB: not a memory size", "Memory the trial may use, e.g. '8GiB', '"),
    ('headroom-with-400-zeros.yaml', "recommendation.headroom: '10000000000000000000000000000... (406 characters) is more than 1 PiB: not a memory size", 'Memory to keep free below the capacity: '),
    ('timeout-infinite.yaml', "search.trial_timeout: '.inf' is not a finite number", "a spec's numbers are batch sizes, steps"),
    ('kwargs-nan.yaml', "optimizer.kwargs.lr: '.nan' is not a finite number", "a spec's numbers are batch sizes, steps"),
    ('factory-deep-expression.yaml', "model.factory: {here}/deep_expression.py is nested too deeply for Python's parser (RecursionError)", 'split the long expression into several'),
    ('factory-is-a-device.yaml', 'model.factory: /dev/zero is a character device, not a Python file', 'a pipe or a device is refused (it may ne'),
    ('factory-is-a-directory.yaml', 'model.factory: {here} is a directory, not a Python file', 'give a .py file'),
    ('yaml-duplicate-key.yaml', "line 5, column 1: not valid YAML: duplicate key 'device' (YAML would keep only the last one)", 'fix the YAML syntax at that place'),
    ('yaml-tab-indent.yaml', "line 2, column 1: not valid YAML: found character '\\t' that cannot start any token", 'fix the YAML syntax at that place'),
    ('yaml-unclosed-flow.yaml', "line 2, column 6: not valid YAML: expected ',' or '}', but got ':'", 'fix the YAML syntax at that place'),
    ('zero-budget.yaml', "memory_budget: a size must be at least one byte, got 0; write e.g. '8GiB' or '512MiB'", "Memory the trial may use, e.g. '8GiB', '"),
    ('zero-in-shape.yaml', 'input.shape.1: Input should be greater than or equal to 1', 'Per-sample input shape without the batch'),
    ('tokens-without-lengths.yaml', 'search.bucket_lengths: unit tokens needs the lengths your sampler pads its buckets to, e.g. search.bucket_lengths: [128, 256, 512]', 'With unit tokens: the padded lengths your'),
    ('tokens-bucket-length-zero.yaml', 'search.bucket_lengths.1: Input should be greater than or equal to 1', 'With unit tokens: the padded lengths your'),
    ('tokens-bucket-length-fraction.yaml', 'search.bucket_lengths.1: Input should be a valid integer', 'With unit tokens: the padded lengths your'),
    ('tokens-lengths-without-unit.yaml', 'search.bucket_lengths: applies to unit tokens; set search.unit: tokens, or remove it', 'With unit tokens: the padded lengths your'),
    ('tokens-unit-unknown.yaml', "search.unit: Input should be 'samples' or 'tokens'", "use one of 'samples' or 'tokens'"),
    ('tokens-with-data.yaml', 'search.unit: tokens with data is not built yet', None),
    ('tokens-with-eval-pass.yaml', 'training.eval_pass: the evaluation batch is searched in samples', None),
    ('zero-start.yaml', 'search.start_batch_size: Input should be greater than or equal to 1', 'First batch tried. 2 by default: BatchNo'),
]

NEEDS_THE_MODEL = [
    ("run-factory-raises.yaml", "model: cannot be built: RuntimeError: this factory is broken on purpose"),
    ("run-output-classes-mismatch.yaml", "target: does not match the model's output: ShapeMismatch: the model's "
     "output has shape [2, 1000] (per sample [1000]), so its class dimension is 1000, not target.classes = 10"),
    ("run-output-shape-mismatch.yaml", "target: does not match the model's output: ShapeMismatch: the model's "
     "output per sample has shape [2], not target.shape = [3]"),
    ("run-input-does-not-fit-model.yaml", "input.shape: does not fit the model: RuntimeError:"),
    ("run-kwarg-typo.yaml", "model: cannot be built: TypeError:"),
    ("run-data-factory-raises.yaml", "data.dataset: cannot be used: RuntimeError: this dataset is broken on purpose"),
    ("run-data-empty.yaml", "data.dataset: cannot be used: ValueError: returned an empty dataset (len 0): there is no "
     "batch to try"),
    ("run-data-iterable.yaml", "data.dataset: cannot be used: TypeError: returned an IterableDataset (Stream), whose "
     "samples cannot be taken by index: materialise its longest samples into a map-style dataset"),
    ("run-data-collate-does-not-fit-model.yaml", "data.collate_fn: does not make a batch of the longest samples "
     "that the model takes: TypeError: the model cannot take the collated batch: Linear.forward() got an "
     "unexpected keyword argument 'input_ids'"),
    ("run-data-length-not-a-number.yaml", "data.length: cannot give the samples' lengths: TypeError: returned 'long' "
     "(str) for sample 0: a length must be a finite number >= 0"),
]


def assert_refused(run, path: Path, first_line: str, fix: str | None, *, document: bool = False) -> None:
    """Exit 2, no traceback, one message naming ``path`` that starts with ``first_line``, then ``fix`` (None: no fix
    line checked). On stdout nothing, or with ``document`` (``isoprobe run``: every stop prints its document, issue
    56) the ``bad_spec`` result whose message is the same words."""
    assert run.returncode == 2, run.stderr
    if document:
        import json

        result = json.loads(run.stdout)
        assert result["stop_reason"] == "bad_spec" and result["answered"] is False and result["trials"] == []
        assert f"isoprobe: {result['message']}" in run.stderr
    else:
        assert run.stdout == ""
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.startswith(f"isoprobe: {path}: ")]  # exactly one message
    assert lines[at].startswith(f"isoprobe: {path}: {first_line}"), lines[at]
    if fix is not None:
        assert lines[at + 1].strip().startswith(f"fix: {fix}"), lines
