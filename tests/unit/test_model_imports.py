"""The installed modules the model's code imports are preloaded like the model's library (Facts.model_imports).

Measured (benchmarks/studies/frameworks_table.py, docs/measurements.md): a LightningModule whose file imports
transformers' GPT-2, forked from a server that had imported lightning (and so transformers' package) but not
the GPT-2 modules, held ~1.3 MiB more at the step's peak than a fresh process and answered 84 where the edge
is 85 (6 of 8 forked trials at 85 ran out of memory). With the 243 modules preloaded: 85 in 2 of 2 runs.
"""

from __future__ import annotations

import sys
import types

import yaml

from isoprobe.child.sources import installed_packages_imported
from isoprobe.pipeline.environment import preload, trial_conditions
from isoprobe.spec.load import load_spec
from scripted_probe import hog_spec


def test_only_new_top_level_installed_packages_are_named():
    user = types.ModuleType("user_models")
    user.__file__ = "/home/someone/models.py"
    modules = {"yaml": yaml, "yaml.nodes": sys.modules["yaml.nodes"], "json": sys.modules["json"],
               "user_models": user, "_yaml": yaml, "isoprobe": sys.modules["isoprobe"], "os": sys.modules["os"]}
    # json, os: the standard library; _yaml: private; the user's file and isoprobe: never preloaded.
    assert installed_packages_imported(set(), modules) == ["yaml", "yaml.nodes"]
    assert installed_packages_imported({"yaml"}, modules) == ["yaml.nodes"]  # a submodule of a package imported


def test_the_preload_imports_them_last_and_once():
    spec = load_spec(hog_spec())
    assert preload(spec, ("transformers", "torch", "torch._dynamo")) == ("torch", "torch._dynamo", "transformers")
    assert trial_conditions(spec, "cpu", 1 << 30, model_imports=("yaml",)).preload[-1] == "yaml"
    assert trial_conditions(spec, "cpu", 1 << 30).preload == preload(spec)
