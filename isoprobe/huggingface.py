"""``find_batch_size(build_trainer)``: the Hugging Face Trainer's largest batch, found in fresh processes.

In place of ``TrainingArguments(auto_find_batch_size=True)``, which retries the
training loop at 0.9 x the batch in the same process after each out-of-memory
error (accelerate's ``find_executable_batch_size``), so that what the failed
attempts left behind makes its answer too small or leaves it at one that fails
later. Here the user's own function builds their Trainer at each candidate
batch in a fresh child process, whose ``trainer.train()`` runs the trial's steps
(``model.hf_trainer``; ``child.huggingface`` runs it); the edge search, the
cache and the result are ``probe()``'s. This process imports neither torch nor
transformers for it, so a training script asks before it builds anything.

The function is named to the child by where it lives, not pickled: a function
of the script being run (``__main__``) or of a top-level module by its file
(``/abs/path/train.py:build_trainer``), one of a package by its module
(``package.module:build_trainer``, which must then be importable from the
current directory or the environment). The child loads a file under another
name than ``__main__``, so a script's own training must sit under
``if __name__ == "__main__":`` (as with multiprocessing's spawn).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from isoprobe.report.result import Result


def find_batch_size(
    build_trainer: Callable[..., Any] | str,
    *,
    kwargs: Mapping[str, Any] | None = None,
    device: str | None = None,
    memory_budget: str | int | None = None,
    max_batch_size: int | None = None,
    target_global_batch: int | None = None,
    eval_pass: bool = False,
    overrides: Mapping[str, Any] | None = None,
    cache: bool = True,
    refresh: bool = False,
    quiet: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Result:
    """The largest ``per_device_train_batch_size`` at which ``build_trainer(batch_size, **kwargs).train()`` fits.

    ``build_trainer``: a function ``f(batch_size, **kwargs)`` returning a
    ``transformers.Trainer`` whose ``per_device_train_batch_size`` is
    ``batch_size``, or its reference as a string (``"train.py:build_trainer"``).
    ``target_global_batch`` sets ``plan.target_global_batch``: the result's
    ``accumulation`` then holds the micro-batch and the
    ``gradient_accumulation_steps`` that reach it. ``eval_pass`` also runs the
    Trainer's evaluation after the training steps of each trial. ``device``,
    ``memory_budget``, ``max_batch_size``, ``overrides``, ``cache``,
    ``refresh``, ``quiet`` and ``progress`` are ``probe()``'s; so are the errors
    (``SpecError``, ``ProbeError``) and the ``Result``.
    """
    from isoprobe.api import probe

    spec: dict[str, Any] = {"model": {"hf_trainer": reference(build_trainer), "kwargs": dict(kwargs or {})}}
    if eval_pass:
        spec["training"] = {"eval_pass": True}
    if target_global_batch is not None:
        spec["plan"] = {"target_global_batch": target_global_batch}
    return probe(
        spec,
        device=device,
        memory_budget=memory_budget,
        max_batch_size=max_batch_size,
        overrides=overrides,
        cache=cache,
        refresh=refresh,
        quiet=quiet,
        progress=progress,
    )


def reference(function: Callable[..., Any] | str) -> str:
    """``"file.py:function"`` or ``"module:function"`` for a function the child can import by name (ValueError if
    none)."""
    if isinstance(function, str):
        return function
    name = getattr(function, "__qualname__", None) or getattr(function, "__name__", None)
    module_name = getattr(function, "__module__", None)
    if not name or not module_name or "." in name or "<" in name:
        raise ValueError(
            f"find_batch_size needs a function defined at the top level of a module or script, so that "
            f"a fresh process can import it by name; got {function!r}"
        )
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if module_name == "__main__" or "." not in module_name:
        if not file:
            raise ValueError(
                f"{name} is defined in {module_name}, which has no file (an interactive session or a "
                "notebook): put it in a .py file and import it from there"
            )
        return f"{os.path.abspath(file)}:{name}"
    return f"{module_name}:{name}"
