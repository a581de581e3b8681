"""Loading specs from YAML: defaults, every problem at once, command-line overrides, paths."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from isoprobe.spec import catalog
from isoprobe.errors import Problem, SpecError
from isoprobe.spec.load import check_references, load_spec

MINIMAL = """\
model:
  torchvision: resnet18
input:
  shape: [3, 32, 32]
target:
  classes: 10
"""


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problems_of(path: Path, overrides: dict | None = None) -> list[Problem]:
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides)
    assert info.value.problems, "a SpecError must list at least one problem"
    return info.value.problems


def only(problems: list[Problem], field_prefix: str) -> Problem:
    matching = [p for p in problems if p.field.startswith(field_prefix)]
    assert len(matching) == 1, problems
    return matching[0]


# --------------------------------------------------------------------------- valid specs


def test_full_valid_spec(tmp_path):
    path = write(
        tmp_path,
        """\
        model:
          torchvision: resnet50
          kwargs: {num_classes: 100}
        input:
          shape: [3, 224, 224]
          dtype: bfloat16
        target:
          classes: 100
        optimizer:
          name: sgd
          kwargs: {lr: 0.01}
        search:
          start_batch_size: 4
          max_batch_size: 512
          dataset_size: 1000
          steps: 5
          trial_timeout: 120
        device: cuda:0
        memory_budget: 8GiB
        allocator: "expandable_segments:True"
        recommendation:
          headroom: 0.2
          multiple_of: 8
        """,
    )
    spec = load_spec(path)
    assert spec.model.torchvision == "resnet50"
    assert spec.model.factory is None
    assert spec.model.kwargs == {"num_classes": 100}
    assert spec.input.shape == [3, 224, 224]
    assert spec.input.dtype == "bfloat16"
    assert spec.target.classes == 100 and spec.target.shape is None
    assert spec.optimizer.name == "sgd"
    assert spec.optimizer.kwargs == {"lr": 0.01}
    assert spec.search.start_batch_size == 4
    assert spec.search.max_batch_size == 512
    assert spec.search.dataset_size == 1000
    assert spec.search.cap == 512
    assert spec.search.steps == 5
    assert spec.search.trial_timeout == 120.0
    assert spec.device == "cuda:0"
    assert spec.memory_budget == 8 * 1024**3
    assert spec.allocator == "expandable_segments:True"
    assert spec.recommendation.headroom == pytest.approx(0.2)
    assert spec.recommendation.multiple_of == 8


def test_defaults(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    assert spec.search.start_batch_size == 2
    assert spec.search.steps == 3
    assert spec.search.max_batch_size is None
    assert spec.search.dataset_size is None
    assert spec.search.cap is None
    assert spec.device == "auto"
    assert spec.optimizer.name == "adam"
    assert spec.optimizer.kwargs == {}
    assert spec.memory_budget is None
    assert spec.allocator is None
    assert spec.input.dtype == "float32"
    assert isinstance(spec.recommendation.headroom, float)
    assert spec.recommendation.headroom == pytest.approx(0.1)
    assert spec.recommendation.multiple_of == 1


def test_cap_is_the_lower_of_max_batch_size_and_dataset_size(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL + "search: {max_batch_size: 512, dataset_size: 300}\n"))
    assert spec.search.cap == 300


def test_regression_target_and_int64_input(tmp_path):
    spec = load_spec(
        write(
            tmp_path,
            """\
            model: {torchvision: resnet18}
            input: {shape: [128], dtype: int64, high: 32000}
            target: {shape: [10]}
            """,
        )
    )
    assert spec.input.high == 32000
    assert spec.target.shape == [10]
    assert spec.target.classes is None


# --------------------------------------------------------------------------- unknown keys


def test_unknown_top_level_key_names_the_field_and_suggests_the_spelling(tmp_path):
    problems = problems_of(write(tmp_path, MINIMAL + "optimzer: {name: sgd}\n"))
    problem = only(problems, "optimzer")
    assert "optimzer" in problem.message
    assert "'optimizer'" in problem.fix
    assert "did you mean" in problem.fix


def test_unknown_nested_key_names_the_field_and_suggests_the_spelling(tmp_path):
    problems = problems_of(write(tmp_path, MINIMAL + "search: {max_batch: 64}\n"))
    problem = only(problems, "search.max_batch")
    assert problem.field == "search.max_batch"
    assert "max_batch" in problem.message
    assert "'max_batch_size'" in problem.fix


def test_unknown_key_inside_optimizer(tmp_path):
    problems = problems_of(write(tmp_path, MINIMAL + "optimizer: {nmae: sgd}\n"))
    problem = only(problems, "optimizer.nmae")
    assert "'name'" in problem.fix
    assert "kwargs" in problem.fix  # the known fields at that level are listed


def test_several_problems_are_reported_in_one_error(tmp_path):
    path = write(
        tmp_path,
        """\
        model: {torchvision: resnet18}
        input: {shape: [3, 32, 32]}
        target: {classes: 10}
        optimzer: {name: sgd}
        device: gpu
        search: {steps: 1}
        memory_budget: lots
        """,
    )
    with pytest.raises(SpecError) as info:
        load_spec(path)
    problems = info.value.problems
    assert len(problems) >= 2
    fields = {p.field for p in problems}
    assert {"optimzer", "device", "search.steps", "memory_budget"} <= fields
    rendered = info.value.render()
    assert f"{len(problems)} problem(s) in {path}" in rendered


def test_missing_required_sections_are_reported_by_name(tmp_path):
    problems = problems_of(write(tmp_path, "device: cpu\n"))
    assert [(p.field, p.message) for p in problems] == [
        ("model", "this section is required (the network to train), unless command gives the job's own training "
                  "command")]
    # With a model, input is required unless model.batch makes the batches (and target unless model.loss).
    (no_input,) = problems_of(write(tmp_path, "model: {torchvision: resnet18}\ntarget: {classes: 10}\n"))
    assert no_input.field == "input" and "required" in no_input.message and "model.batch" in no_input.message
    (no_target,) = problems_of(write(tmp_path, "model: {torchvision: resnet18}\ninput: {shape: [3, 8, 8]}\n"))
    assert no_target.field == "target" and "model.loss" in no_target.message


# --------------------------------------------------------------------------- files that are not specs


def test_invalid_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "model:\n  torchvision: [resnet18\ninput: {shape: [1]}\n")
    problems = problems_of(path)
    assert len(problems) == 1
    assert "line" in problems[0].field
    assert "not valid YAML" in problems[0].message


def test_yaml_that_is_not_a_mapping(tmp_path):
    problems = problems_of(write(tmp_path, "- resnet18\n- resnet50\n"))
    assert len(problems) == 1
    assert "mapping" in problems[0].message
    assert "list" in problems[0].message


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.source == str(path)
    assert "no such file" in info.value.problems[0].message
    assert str(path) in info.value.render()


def test_empty_file_is_one_clear_problem_not_a_crash(tmp_path):
    [problem] = problems_of(write(tmp_path, ""))
    assert problem.message == "the file is empty"


def test_an_empty_mapping_reports_the_missing_model(tmp_path):
    problems = problems_of(write(tmp_path, "{}\n"))
    assert {"model"} == {p.field for p in problems}


# --------------------------------------------------------------------------- field rules


def test_steps_one_is_rejected_with_the_reason(tmp_path):
    problem = only(problems_of(write(tmp_path, MINIMAL + "search: {steps: 1}\n")), "search.steps")
    assert "2" in problem.message
    assert "at least 2" in problem.fix
    assert "Adam" in problem.fix


def test_start_batch_size_above_max_batch_size(tmp_path):
    problems = problems_of(write(tmp_path, MINIMAL + "search: {start_batch_size: 64, max_batch_size: 32}\n"))
    problem = only(problems, "search")
    assert "start_batch_size 64" in problem.message
    assert "max_batch_size 32" in problem.message


def test_start_batch_size_above_dataset_size(tmp_path):
    problems = problems_of(write(tmp_path, MINIMAL + "search: {start_batch_size: 8, dataset_size: 4}\n"))
    problem = only(problems, "search")
    assert "dataset_size 4" in problem.message


def test_start_equal_to_caps_is_fine(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL + "search: {start_batch_size: 8, max_batch_size: 8, dataset_size: 8}\n"))
    assert spec.search.cap == 8


@pytest.mark.parametrize(
    "written,expected",
    [
        ("8GiB", 8 * 1024**3),
        ("16 GB", 16 * 1000**3),
        ("512MiB", 512 * 1024**2),
        ("1073741824", 1024**3),
    ],
)
def test_memory_budget_parsing(tmp_path, written, expected):
    spec = load_spec(write(tmp_path, MINIMAL + f"memory_budget: {written}\n"))
    assert spec.memory_budget == expected


@pytest.mark.parametrize("written", ["lots", "-1", "0", "8 XB", "true"])
def test_memory_budget_rejected(tmp_path, written):
    problem = only(problems_of(write(tmp_path, MINIMAL + f"memory_budget: {written}\n")), "memory_budget")
    assert problem.field == "memory_budget"


def test_memory_budget_rejection_says_how_to_write_a_size(tmp_path):
    problem = only(problems_of(write(tmp_path, MINIMAL + "memory_budget: lots\n")), "memory_budget")
    assert "'lots'" in problem.message
    assert "8GiB" in problem.message


def test_headroom_fraction(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL + "recommendation: {headroom: 0.1}\n"))
    assert isinstance(spec.recommendation.headroom, float)
    assert spec.recommendation.headroom == pytest.approx(0.1)


def test_headroom_zero_is_a_fraction(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL + "recommendation: {headroom: 0}\n"))
    assert spec.recommendation.headroom == 0


def test_headroom_size_string_is_bytes_as_an_int(tmp_path):
    # Must stay an int: headroom.headroom_in_bytes treats a float as a fraction of the capacity.
    spec = load_spec(write(tmp_path, MINIMAL + "recommendation: {headroom: 2GiB}\n"))
    assert type(spec.recommendation.headroom) is int
    assert spec.recommendation.headroom == 2 * 1024**3


def test_headroom_whole_number_is_bytes(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL + "recommendation: {headroom: 1073741824}\n"))
    assert type(spec.recommendation.headroom) is int
    assert spec.recommendation.headroom == 1024**3


@pytest.mark.parametrize("written", ["1.5", "lots", "true"])
def test_headroom_rejected(tmp_path, written):
    problem = only(
        problems_of(write(tmp_path, MINIMAL + f"recommendation: {{headroom: {written}}}\n")),
        "recommendation.headroom",
    )
    assert problem.field == "recommendation.headroom"


def test_headroom_one_and_a_half_says_why(tmp_path):
    problem = only(
        problems_of(write(tmp_path, MINIMAL + "recommendation: {headroom: 1.5}\n")), "recommendation.headroom"
    )
    assert "fraction" in problem.message


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:1", "cuda:12"])
def test_device_accepted(tmp_path, device):
    assert load_spec(write(tmp_path, MINIMAL + f"device: '{device}'\n")).device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "CPU", "mps", "cuda:1 "])
def test_device_rejected_with_a_fix(tmp_path, device):
    problem = only(problems_of(write(tmp_path, MINIMAL + f"device: '{device}'\n")), "device")
    assert "not a device" in problem.message
    assert "cuda" in problem.fix


def test_optimizer_name_must_be_known(tmp_path):
    problem = only(problems_of(write(tmp_path, MINIMAL + "optimizer: {name: lion}\n")), "optimizer.name")
    assert "adam" in problem.fix and "sgd" in problem.fix


def test_model_with_both_sources_is_rejected(tmp_path):
    path = write(
        tmp_path,
        """\
        model: {torchvision: resnet18, factory: "models:build"}
        input: {shape: [1]}
        target: {classes: 2}
        """,
    )
    problem = only(problems_of(path), "model")
    assert "exactly one" in problem.message


def test_model_with_no_source_is_rejected(tmp_path):
    path = write(
        tmp_path,
        """\
        model: {kwargs: {num_classes: 3}}
        input: {shape: [1]}
        target: {classes: 2}
        """,
    )
    problem = only(problems_of(path), "model")
    assert "exactly one" in problem.message


def test_factory_must_name_a_function(tmp_path):
    path = write(
        tmp_path,
        """\
        model: {factory: "models.py"}
        input: {shape: [1]}
        target: {classes: 2}
        """,
    )
    problem = only(problems_of(path), "model")
    assert "module:function" in problem.message


@pytest.mark.parametrize("target", ["{}", "{classes: 10, shape: [10]}"])
def test_target_needs_exactly_one_of_classes_and_shape(tmp_path, target):
    path = write(tmp_path, f"model: {{torchvision: resnet18}}\ninput: {{shape: [1]}}\ntarget: {target}\n")
    problem = only(problems_of(path), "target")
    assert "exactly one" in problem.message


def test_int64_input_needs_high(tmp_path):
    path = write(tmp_path, "model: {torchvision: resnet18}\ninput: {shape: [16], dtype: int64}\ntarget: {classes: 2}\n")
    problem = only(problems_of(path), "input")
    assert "high" in problem.message


def test_high_only_for_int64(tmp_path):
    path = write(tmp_path, "model: {torchvision: resnet18}\ninput: {shape: [16], high: 5}\ntarget: {classes: 2}\n")
    problem = only(problems_of(path), "input")
    assert "int64" in problem.message


# --------------------------------------------------------------------------- command-line overrides


def test_overrides_are_applied(tmp_path):
    path = write(tmp_path, MINIMAL + "device: cuda\nmemory_budget: 8GiB\nsearch: {max_batch_size: 512, steps: 4}\n")
    spec = load_spec(path, {"--memory-budget": "2GiB", "--device": "cpu", "--max-batch-size": 64})
    assert spec.memory_budget == 2 * 1024**3
    assert spec.device == "cpu"
    assert spec.search.max_batch_size == 64
    assert spec.search.steps == 4  # the rest of the section is kept


def test_override_creates_a_missing_section(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL), {"--max-batch-size": 16})
    assert spec.search.max_batch_size == 16
    assert spec.search.start_batch_size == 2


def test_none_override_leaves_the_spec_value(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL + "device: cuda:1\n"), {"--device": None, "--memory-budget": None})
    assert spec.device == "cuda:1"
    assert spec.memory_budget is None


def test_invalid_overrides_name_their_flags(tmp_path):
    problems = problems_of(
        write(tmp_path, MINIMAL), {"--memory-budget": "lots", "--device": "gpu", "--max-batch-size": 0}
    )
    by_field = {p.field: p for p in problems}
    assert "memory_budget (from --memory-budget)" in by_field
    assert "device (from --device)" in by_field
    assert "search.max_batch_size (from --max-batch-size)" in by_field


def test_invalid_override_in_rendered_error(tmp_path):
    path = write(tmp_path, MINIMAL)
    with pytest.raises(SpecError) as info:
        load_spec(path, {"--device": "gpu"})
    rendered = info.value.render()
    assert "--device" in rendered
    assert str(path) in rendered


# --------------------------------------------------------------------------- factory paths


def test_file_factory_is_resolved_relative_to_the_spec_folder(tmp_path, monkeypatch):
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (spec_dir / "models.py").write_text("def build():\n    pass\n")
    path = write(spec_dir, "model: {factory: 'models.py:build'}\ninput: {shape: [4]}\ntarget: {shape: [2]}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # resolution must not depend on the working directory

    spec = load_spec(path)

    file, function = spec.model.factory.rsplit(":", 1)
    assert function == "build"
    assert Path(file).is_absolute()
    assert Path(file) == (spec_dir / "models.py").resolve()


def test_file_factory_in_a_subfolder(tmp_path):
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "small.py").write_text("def make():\n    pass\n")
    path = write(tmp_path, "model: {factory: 'nets/small.py:make'}\ninput: {shape: [4]}\ntarget: {shape: [2]}\n")
    spec = load_spec(path)
    assert spec.model.factory == f"{(tmp_path / 'nets' / 'small.py').resolve()}:make"


def test_missing_factory_file_is_an_error(tmp_path):
    path = write(tmp_path, "model: {factory: 'missing.py:build'}\ninput: {shape: [4]}\ntarget: {shape: [2]}\n")
    problem = only(problems_of(path), "model.factory")
    assert "no such file" in problem.message
    assert "missing.py" in problem.message
    assert "relative to the spec" in problem.fix


def test_module_factory_is_left_alone(tmp_path):
    path = write(tmp_path, "model: {factory: 'mypkg.models:build'}\ninput: {shape: [4]}\ntarget: {shape: [2]}\n")
    assert load_spec(path).model.factory == "mypkg.models:build"


# --------------------------------------------------------------------------- check_references


def _torchvision_names():
    return catalog.torchvision_model_names()


def test_check_references_suggests_a_close_torchvision_name(tmp_path):
    if _torchvision_names() is None:
        pytest.skip("torchvision model names cannot be read from source here")
    path = write(tmp_path, "model: {torchvision: resnet5O}\ninput: {shape: [3, 32, 32]}\ntarget: {classes: 10}\n")
    spec = load_spec(path)
    with pytest.raises(SpecError) as info:
        check_references(spec, str(path))
    problem = only(info.value.problems, "model.torchvision")
    assert "resnet5O" in problem.message
    assert "'resnet50'" in problem.fix


def test_check_references_accepts_a_real_name_and_a_factory(tmp_path):
    if _torchvision_names() is None:
        pytest.skip("torchvision model names cannot be read from source here")
    assert "resnet50" in _torchvision_names()
    check_references(load_spec(write(tmp_path, MINIMAL)), "spec.yaml")
    (tmp_path / "m.py").write_text("def build():\n    pass\n")
    factory = write(tmp_path, "model: {factory: 'm.py:build'}\ninput: {shape: [1]}\ntarget: {classes: 2}\n", "f.yaml")
    check_references(load_spec(factory), "f.yaml")


# --------------------------------------------------------------------------- rendering


def test_render_names_the_file_the_field_and_the_fix(tmp_path):
    path = write(tmp_path, MINIMAL + "optimzer: {name: sgd}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    rendered = info.value.render()
    assert str(path) in rendered
    assert "optimzer" in rendered
    assert "fix:" in rendered
    assert str(info.value) == rendered


def test_problem_render_without_field_or_fix():
    assert Problem("", "no such file").render("a.yaml") == "a.yaml: no such file"
    assert Problem("device", "bad", "use cpu").render("a.yaml") == "a.yaml: device: bad\n    fix: use cpu"


def test_single_problem_has_no_count_header():
    error = SpecError("a.yaml", [Problem("device", "bad", "use cpu")])
    assert "problem(s)" not in error.render()
    two = SpecError("a.yaml", [Problem("device", "bad"), Problem("model", "worse")])
    assert two.render().startswith("2 problem(s) in a.yaml:")


# --------------------------------------------------------------------------- regressions


@pytest.mark.parametrize("budget", ["0.5", ".inf"])
def test_budget_below_one_byte_or_infinite_is_a_spec_error(tmp_path, budget):
    path = write(tmp_path, MINIMAL + f"memory_budget: {budget}\n")
    assert only(problems_of(path), "memory_budget")


def test_negative_headroom_is_rejected(tmp_path):
    path = write(tmp_path, MINIMAL + "recommendation:\n  headroom: -1\n")
    assert "negative" in only(problems_of(path), "recommendation.headroom").message


def test_override_does_not_hide_a_malformed_section(tmp_path):
    path = write(tmp_path, MINIMAL + "search: 5\n")
    assert only(problems_of(path, {"--max-batch-size": 8}), "search")


# --------------------------------------------------------------------------- strict numbers, every field


def _numeric_fields(model=None, prefix: str = "") -> list[tuple[str, bool]]:
    """Every field of the spec whose type takes a number (int or float), by dotted path; True where it is a list.

    Walks the models themselves, so a field added later is covered without being listed here.
    """
    import typing

    from pydantic import BaseModel

    from isoprobe.spec.model import Spec

    def kinds(annotation) -> set:
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is typing.Annotated:
            return kinds(args[0])
        if origin is list:
            return {("list", kind) for kind in kinds(args[0]) if not isinstance(kind, tuple)}
        if args:  # a Union (X | None), a Literal's values are not types
            return set().union(*(kinds(arg) for arg in args if isinstance(arg, type) or typing.get_origin(arg)))
        return {annotation} if isinstance(annotation, type) else set()

    found = []
    for name, field in (model or Spec).model_fields.items():
        path = f"{prefix}{name}"
        types = kinds(field.annotation)
        for sub in (t for t in types if isinstance(t, type) and issubclass(t, BaseModel)):
            found += _numeric_fields(sub, path + ".")
        if types & {int, float}:
            found.append((path, False))
        elif {("list", int), ("list", float)} & types:
            found.append((path, True))
    return found


NUMERIC_FIELDS = _numeric_fields()


def test_the_walk_finds_the_numeric_fields():
    paths = {path for path, _ in NUMERIC_FIELDS}
    assert {"distributed.world_size", "search.max_batch_size", "search.trial_timeout", "memory_budget",
            "recommendation.headroom", "input.shape", "distributed.bucket_cap_mb", "search.parallel"} <= paths
    assert len(paths) >= 20, sorted(paths)


@pytest.mark.parametrize(("path", "in_list"), NUMERIC_FIELDS, ids=[path for path, _ in NUMERIC_FIELDS])
def test_no_numeric_field_reads_a_boolean_as_a_number(tmp_path, path, in_list):
    """``world_size: true`` was one rank, ``max_batch_size: true`` a cap of 1: pydantic's lax mode made true 1."""
    given = {path: [True] if in_list else True}
    if path.startswith("distributed.") and path != "distributed.strategy":
        given["distributed.strategy"] = "ddp"  # so that no check across fields is the only thing to say
    found = [p for p in problems_of(write(tmp_path, MINIMAL), given) if p.field.startswith(path)]
    assert found, f"{path}: true was accepted as a number"


@pytest.mark.parametrize(("path", "value"), [("search.steps", 3.0), ("search.max_batch_size", "64"),
                                             ("distributed.world_size", 2.0)])
def test_no_integer_field_reads_a_float_or_text_as_an_integer(tmp_path, path, value):
    given = {path: value, **({"distributed.strategy": "ddp"} if path.startswith("distributed.") else {})}
    assert [p for p in problems_of(write(tmp_path, MINIMAL), given) if p.field.startswith(path)]


def test_the_max_batch_size_flag_text_is_still_a_number_and_sizes_still_take_text(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL), {"--max-batch-size": " 64 ", "memory_budget": "8GiB",
                                                "recommendation.headroom": "1GiB", "search.trial_timeout": 5})
    assert (spec.search.max_batch_size, spec.memory_budget, spec.search.trial_timeout) == (64, 8 << 30, 5.0)


@pytest.mark.parametrize("parallel", [2, "auto"])
def test_parallel_trials_with_a_gang_are_refused_not_ignored(tmp_path, parallel):
    """Each trial of a distributed spec is a gang of ranks: the slots were silently dropped to one."""
    found = problems_of(write(tmp_path, MINIMAL), {"distributed.strategy": "ddp", "search.parallel": parallel})
    problem = only(found, "search.parallel")
    assert problem.message.startswith(f"{parallel} runs several trials at once, and with distributed.strategy ddp "
                                      "every trial is already a gang of ranks")
    assert load_spec(write(tmp_path, MINIMAL), {"distributed.strategy": "ddp", "search.parallel": 1})
