"""Tests against a real single-node Slurm cluster that tests/slurm/conftest.py starts.

This folder is a package on purpose: pytest imports a package's conftest.py as
``slurm.conftest``. A plain second ``conftest`` module would replace tests/conftest.py
in sys.modules, and the test files that do ``from conftest import ...`` and are
collected after this folder would then import the wrong module.
"""
