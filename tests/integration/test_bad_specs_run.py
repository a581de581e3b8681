"""The hostile specs that need the model built: ``isoprobe run`` refuses each in its inspect child, before any trial.

The corpus (tests/bad_specs/, each file's message) is tests/support/bad_spec_corpus.py; the static ones are
tests/cli/test_bad_specs.py.
"""

from __future__ import annotations

import pytest

from bad_spec_corpus import BAD, NEEDS_THE_MODEL, assert_refused
from conftest import run_cli


@pytest.mark.parametrize(("name", "first_line"), NEEDS_THE_MODEL, ids=[row[0] for row in NEEDS_THE_MODEL])
def test_bad_spec_that_needs_the_model_is_refused_before_any_trial(name, first_line):
    path = BAD / name
    run = run_cli("run", str(path))
    assert_refused(run, path, first_line, None, document=True)
    assert "isoprobe: trial" not in run.stderr
