"""The ``isoprobe`` command (parent side): ``main`` parses and dispatches, one module per subcommand does the work.

- ``main``: arguments, dispatch, every outcome mapped to a documented exit code, PID 1.

- ``run``: probe a spec (or answer from the cache); hook mode's fallback.
- ``spec``: ``validate`` (check a spec, run nothing), ``estimate`` (the traced
  estimate, no trial) and ``schema`` (the result's or the spec's JSON Schema).
- ``results``: ``show`` and ``plot`` a saved result.
- ``sweep``: many specs, locally or as Slurm job arrays (``isoprobe.sweep``).
- ``frontier``: one spec at every value of a field (``pipeline.frontier``).
- ``common``: what several of them share (the spec with its overrides, the
  result's rendering, a usage error).

Each command function takes the parsed arguments and returns an exit code; a
user's mistake is raised as ``SpecError`` and mapped to its exit code by
``cli.main``. Every module imports at its top only what is light (no pydantic,
no torch): start-up time is part of the interface.
"""
