"""Resolving the callables a spec names ('module:function' or '/abs/file.py:function') in the child.

Apart from ``workload`` so that every child module that runs the user's code
(the model, the batch, the dataset) can import it without importing the rest.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

from isoprobe.spec.model_section import is_file_reference


def import_callable(reference: str, python_path: list[str]):
    """Resolve 'module:function' or '/abs/file.py:function' to the callable."""
    target, function = reference.rsplit(":", 1)
    for entry in reversed(python_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if is_file_reference(target):
        name = f"isoprobe_user_{abs(hash(target))}"
        module = sys.modules.get(name)
        if module is None:
            module_spec = importlib.util.spec_from_file_location(name, target)
            if module_spec is None or module_spec.loader is None:
                raise ImportError(f"cannot load {target}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
            sys.modules[name] = module  # factory, batch and loss from one file share one module
    else:
        module = importlib.import_module(target)
    found = getattr(module, function, None)
    if found is None or not callable(found):
        raise AttributeError(f"{target} has no callable named {function!r}")
    return found
