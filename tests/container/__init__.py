"""The container tier: the project's image built with podman and run with runc (tests/container/conftest.py).

A package on purpose, as tests/slurm is: pytest then imports this folder's
conftest.py as ``container.conftest``. A plain second ``conftest`` module would
replace tests/conftest.py in sys.modules, and every test file collected after
this folder that does ``from conftest import ...`` would import the wrong one
(measured: 41 collection errors in the whole suite).
"""
