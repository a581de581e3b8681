"""Fuzzing the spec loader: whatever the file holds, the user gets a SpecError or a Spec, never a traceback.

Any other exception escaping ``load_spec`` / ``check_references`` would reach the
user as a traceback with exit code 1; these property tests look for one. Beyond
YAML soup and replaced values, they write raw tokens that PyYAML, int() and
float() choke on (5000-digit integers, overflowing floats, sizes of 400 digits,
base-60 and hex integers, nesting far past any spec), at any field, and the
same through the command-line overrides.
"""

from __future__ import annotations

import math

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isoprobe.errors import SpecError
from isoprobe.spec.model import Spec
from isoprobe.spec.load import check_references, load_spec

VALID = {
    "model": {"torchvision": "resnet18", "kwargs": {"num_classes": 10}},
    "input": {"shape": [3, 32, 32], "dtype": "float32"},
    "target": {"classes": 10},
    "optimizer": {"name": "adam", "kwargs": {"lr": 0.001}},
    "search": {"start_batch_size": 2, "max_batch_size": 64, "steps": 3, "trial_timeout": 60},
    "device": "cpu",
    "memory_budget": "2GiB",
    "recommendation": {"headroom": 0.1, "multiple_of": 8},
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["8GiB", "-1", "0", "1e400", "cuda:99", "auto", "resnet50", "x.py:f", "mod:fn", ":", ""]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))


PATHS = list(_paths(VALID))[1:]


def _load(tmp_path, text: str | bytes, overrides=None):
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass"))
    try:
        spec = load_spec(path, overrides)
        check_references(spec, str(path))
    except SpecError as error:
        assert error.problems and error.render()
        return None
    assert isinstance(spec, Spec)
    return spec


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(tmp_path, data):
    _load(tmp_path, data)


@FUZZ
@given(text=st.text(alphabet=st.sampled_from(list("{}[]:,-&*!|>'\"#%@`?\t\n abcd019.")), max_size=200))
def test_yaml_punctuation_soup(tmp_path, text):
    _load(tmp_path, text)


@FUZZ
@given(path=st.sampled_from(PATHS), value=values, extra_key=st.one_of(st.none(), st.text(max_size=8)))
def test_a_valid_spec_with_one_value_replaced(tmp_path, path, value, extra_key):
    spec = yaml.safe_load(yaml.safe_dump(VALID))
    node = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    if extra_key is not None:
        node[extra_key] = value
    try:
        text = yaml.safe_dump(spec, allow_unicode=True)
    except (yaml.YAMLError, ValueError):
        return
    loaded = _load(tmp_path, text)
    if loaded is not None and loaded.memory_budget is not None:
        assert math.isfinite(loaded.memory_budget) and loaded.memory_budget >= 1


@FUZZ
@given(
    device=st.one_of(st.none(), st.text(max_size=10)),
    budget=st.one_of(st.none(), st.text(max_size=10)),
    cap=st.one_of(st.none(), st.integers(min_value=-(2**40), max_value=2**40)),
)
def test_command_line_overrides(tmp_path, device, budget, cap):
    _load(tmp_path, yaml.safe_dump(VALID), {"--device": device, "--memory-budget": budget, "--max-batch-size": cap})


def _digits(first: str = "1"):
    return st.integers(1, 6000).map(lambda n: first + "0" * n)


#: Tokens written into the YAML as they are: yaml.safe_dump cannot even write most of them.
hostile_tokens = st.one_of(
    _digits(),                                                     # past Python's 4300-digit int() limit, or not
    _digits("-9"),
    st.integers(1, 6000).map(lambda n: "0x" + "f" * n),
    st.integers(1, 3000).map(lambda n: ":".join(["59"] * n)),      # YAML 1.1's base-60 integers
    st.integers(300, 6000).map(lambda n: f"1.0e+{n}"),            # floats that overflow to infinity
    st.sampled_from([".inf", "-.inf", "+.inf", ".nan", ".NaN", "1e400", "!!float 1.0e+999", "!!int 12abc",
                     "2001-13-45", "!!binary '/w=='", "!!set {a}"]),
    _digits().map(lambda number: f"'{number}GiB'"),                 # a size that overflows a float
    _digits().map(lambda number: f"'{number}'"),
    st.integers(1, 3000).map(lambda n: "[" * n + "1" + "]" * n),   # nesting, up to far past any spec
    st.integers(1, 3000).map(lambda n: "{a: " * n + "1" + "}" * n),
)


@FUZZ
@given(path=st.sampled_from(PATHS), token=hostile_tokens)
def test_a_valid_spec_with_one_raw_hostile_token(tmp_path, path, token):
    spec = yaml.safe_load(yaml.safe_dump(VALID))
    node = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = "HOSTILE_TOKEN"
    loaded = _load(tmp_path, yaml.safe_dump(spec).replace("HOSTILE_TOKEN", token))
    if loaded is not None:
        loaded.model_dump_json()  # what travels to the trial and into the cache key must serialise


@FUZZ
@given(budget=st.one_of(_digits(), _digits().map(lambda number: number + "GiB"), st.sampled_from(["inf", "nan"])),
       cap=st.one_of(_digits(), _digits("-"), st.sampled_from(["", "lots", "1e3", "4.5"])))
def test_command_line_overrides_with_hostile_numbers(tmp_path, budget, cap):
    _load(tmp_path, yaml.safe_dump(VALID), {"--memory-budget": budget, "--max-batch-size": cap})
