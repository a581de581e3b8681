"""Inside the user's own processes: which batch each optimizer step trained at (``_isoprobe_shim`` loads this).

What batch did a step train at? The command was asked for one (``{batch_size}``), but a script may ignore it
(a fixed batch), pick its own (Accelerate's ``find_executable_batch_size``, ``auto_find_batch_size=True``, a
halving loop that catches its own out-of-memory error), or run out of data. Every step line carries the input
shapes of the *root* forwards (a module called while no other module call is in progress in that thread) that
completed with gradients on and trainable parameters since the step before: the model's own forward, not its
submodules', not a frozen teacher's, not a loss module's, not an evaluation under ``no_grad``, and not an
attempt that ran out of memory inside its forward. The supervisor (``isoprobe.child.trained_batch``) judges
them. Global module hooks: one pre-hook and one always-called forward hook keep the depth (an exception in a
forward still unwinds it), one forward hook with kwargs records (HF models take ``model(**batch)``). Nothing
runs while Dynamo traces: a compiled region sees no hook of ours.

It also counts the root forwards of *evaluation* since the step before (gradients off, ``inference_mode``, or a
module in eval mode): the trial waits for the script's first evaluation pass before it calls a maximum
(``isoprobe.report.cycle``, issue 55). Those are counted whatever their module, a frozen one included (an EMA copy
has no trainable parameter); the supervisor tells a pass from a frozen teacher's forward in every step.

Standard library only, as the rest of the shim; loaded once torch's optimizers are imported.
"""

import sys
import threading
import weakref

#: Root forwards kept per step (the last ones: a step's batch is its last forward's, or its micro-batches' sum).
FORWARDS_KEPT = 16
_forwards = []
#: Evaluation root forwards since the last ``take_evaluations`` (a one-element list: the hook adds to it).
_evaluations = [0]
_depths = {}
_trainable_modules = weakref.WeakKeyDictionary()


def watch(modules):
    """Register the hooks on ``torch.nn.modules.module``; False when there is none to register on."""
    if modules is None:
        return False
    get_ident = threading.get_ident
    depths = _depths
    compiling = _compiling_check()

    def enter(module, args):
        if not compiling():
            key = get_ident()
            depths[key] = depths.get(key, 0) + 1

    def leave(module, args, result):
        if not compiling():
            key = get_ident()
            depths[key] = max(0, depths.get(key, 0) - 1)

    def record(module, args, kwargs, result):
        if compiling() or depths.get(get_ident(), 0) != 1:
            return
        try:
            grad = _grad_enabled()
            if not grad or not module.training:
                _evaluations[0] += 1
            if not grad or not _trainable(module):
                return
            shape = _first_shape(args, 0) or _first_shape(tuple((kwargs or {}).values()), 0)
            if shape is not None:
                _forwards.append(shape)
                if len(_forwards) > 4 * FORWARDS_KEPT:
                    del _forwards[:-FORWARDS_KEPT]
        except Exception:
            pass

    modules.register_module_forward_pre_hook(enter)
    modules.register_module_forward_hook(record, with_kwargs=True)
    modules.register_module_forward_hook(leave, always_call=True)  # after ``record``: it still sees depth 1
    return True


def take():
    """The shapes recorded since the last call (the last ``FORWARDS_KEPT``), for the step that just ended."""
    shapes = _forwards[-FORWARDS_KEPT:]
    del _forwards[:]
    return shapes


def take_evaluations():
    """The evaluation root forwards counted since the last call."""
    count, _evaluations[0] = _evaluations[0], 0
    return count


def _compiling_check():
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return check if callable(check) else (lambda: False)


def _grad_enabled():
    torch = sys.modules.get("torch")
    return torch is None or torch.is_grad_enabled()


def _trainable(module):
    """Whether the module has a parameter that trains (kept per module, weakly: a finder may build models anew)."""
    known = _trainable_modules.get(module)
    if known is None:
        known = any(p.requires_grad for p in module.parameters())
        try:
            _trainable_modules[module] = known
        except TypeError:  # a module that cannot be weakly referenced: asked again next time
            pass
    return known


def _first_shape(values, depth):
    """The shape of the first tensor in ``values`` (a forward's arguments), looking into lists, tuples and dicts."""
    for value in values:
        shape = getattr(value, "shape", None)
        if shape is not None and hasattr(value, "dim"):
            return [int(n) for n in shape] or None
        if depth < 3 and isinstance(value, (list, tuple)):
            found = _first_shape(value, depth + 1)
        elif depth < 3 and isinstance(value, dict):
            found = _first_shape(tuple(value.values()), depth + 1)
        else:
            continue
        if found is not None:
            return found
    return None
