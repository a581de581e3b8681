"""Inside the user's own processes: which batch each optimizer step trained at (``_isoprobe_shim`` loads this).

What batch did a step train at? The command was asked for one (``{batch_size}``), but a script may ignore it
(a fixed batch), pick its own (Accelerate's ``find_executable_batch_size``, ``auto_find_batch_size=True``, a
halving loop that catches its own out-of-memory error), or run out of data. Every step line carries the input
shapes of the *root* forwards (a module called while no other module call is in progress in that thread) that
completed with gradients on and trainable parameters since the step before: the model's own forward, not its
submodules', not a frozen teacher's, not a loss module's, not an evaluation under ``no_grad``, and not an
attempt that ran out of memory inside its forward. The supervisor (``isoprobe.child.command_trial.trained_batch``)
judges
them. Global module hooks: one pre-hook and one always-called forward hook keep the depth (an exception in a
forward still unwinds it), one forward hook with kwargs records (HF models take ``model(**batch)``). Nothing
runs while Dynamo traces: a compiled region sees no hook of ours.

It also counts the root forwards of *evaluation* since the step before (gradients off, ``inference_mode``, or a
module in eval mode): the trial waits for the script's first evaluation pass before it calls a maximum
(``isoprobe.report.cycle``, issue 55). Those are counted whatever their module, a frozen one included (an EMA copy
has no trainable parameter); the supervisor tells a pass from a frozen teacher's forward in every step.

It also says where the process is in its next step (``marks``): once the step's first training root forward
begins and once it returns, the shim writes a line, so that a trial that times out with its ranks at the same step
tells the rank hung before its forward from its peers waiting in the backward's collective (issue 56).

Standard library only, as the rest of the shim; loaded once torch's optimizers are imported.
"""

import sys
import threading
import weakref

#: typing's flag without importing typing into the user's process (annotations here are strings: never evaluated).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Root forwards kept per step (the last ones: a step's batch is its last forward's, or its micro-batches' sum).
FORWARDS_KEPT = 16
_forwards: "list[list[int]]" = []
#: Evaluation root forwards since the last ``take_evaluations`` (a one-element list: the hook adds to it).
_evaluations = [0]
#: Since the last ``take_inputs``, per module (by id): [forwards, leading dimensions' sum, the last one's counts];
#: and for the step: input elements, and the counts of every forward, abandoned ones included ("tried").
_modules: "dict[int, list[Any]]" = {}
_inputs = {"elements": 0, "tried": set()}
#: Counts kept per step (the smallest: a batch is rarely the largest dimension of a model's inputs).
COUNTS_KEPT = 64
#: Items of one list looked into: a detection model's list of images; the rest are counted by the list's length.
ITEMS_WALKED = 256
_depths: "dict[int, int]" = {}
#: Per thread: the arguments of the training root forward in progress, until it completes (then None).
_pending: "dict[int, tuple | None]" = {}
_trainable_modules: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
#: Since the last step: whether a training root forward began, and whether one returned; ``notify`` (set by the
#: shim) is called with "began" and "returned", once each per step.
marks = {"began": False, "returned": False, "notify": None}


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
            if depths[key] == 1:
                _pending[key] = args if _training_forward(module) else None
                if _pending[key] is not None and not marks["began"]:
                    _mark("began")

    def leave(module, args, result):
        if not compiling():
            key = get_ident()
            depths[key] = max(0, depths.get(key, 0) - 1)
            if depths[key] == 0 and _pending.get(key) is not None:
                try:  # a training forward that never completed (it raised: a finder's attempt out of memory)
                    _counts(tuple(_pending[key]), 0, _inputs["tried"])
                except Exception:
                    pass
                _pending[key] = None

    def record(module, args, kwargs, result):
        if compiling() or depths.get(get_ident(), 0) != 1:
            return
        _pending[get_ident()] = None
        try:
            grad = _grad_enabled()
            if not grad or not module.training:
                _evaluations[0] += 1
            if not grad or not _trainable(module):
                return
            if not marks["returned"]:
                _mark("returned")
            values = tuple(args) + tuple((kwargs or {}).values())
            shape = _first_shape(values, 0)
            if shape is not None:
                _forwards.append(shape)
                if len(_forwards) > 4 * FORWARDS_KEPT:
                    del _forwards[:-FORWARDS_KEPT]
            seen = set()
            _inputs["elements"] += _counts(values, 0, seen)
            _inputs["tried"] |= seen
            entry = _modules.setdefault(id(module), [0, 0, seen])
            entry[0] += 1
            entry[1] += shape[0] if shape else 0
            entry[2] = seen
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


def take_inputs():
    """What the training forwards since the last call took, as the step line's fields: the most forwards one module
    ran and their leading dimensions' sum, the elements of every tensor, the counts each module's last forward
    shows (the batch it trained at: a finder's attempts come before it), and the counts every forward showed."""
    entries = list(_modules.values())
    most = max(entries, key=lambda e: e[0]) if entries else [0, 0, set()]
    last = set().union(*(e[2] for e in entries)) if entries else set()
    taken = {
        "forward_count": most[0],
        "leading_sum": most[1],
        "input_elements": _inputs["elements"],
        "batch_counts": sorted(last)[:COUNTS_KEPT],
        "tried_counts": sorted(_inputs["tried"])[:COUNTS_KEPT],
    }
    _modules.clear()
    _inputs.update(elements=0, tried=set())
    marks.update(began=False, returned=False)
    return taken


def _mark(what):
    marks[what] = True
    if marks["notify"] is not None:
        try:
            marks["notify"](what)
        except Exception:
            pass


def take_evaluations():
    """The evaluation root forwards counted since the last call."""
    count, _evaluations[0] = _evaluations[0], 0
    return count


def _training_forward(module):
    try:
        return _grad_enabled() and _trainable(module)
    except Exception:
        return False


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


def _counts(values, depth, counts):
    """Every count ``values`` (a forward's arguments) show, added to ``counts``: each tensor's dimensions, the product
    of its first two (tokens), a 1-d integer tensor's length less one (offsets: ``cu_seqlens``), a list's length, a
    batch object's ``num_graphs`` or ``batch_size``. Returns the elements of the tensors found (a list longer than
    ``ITEMS_WALKED`` is counted from the part looked into). An object's attributes are looked into, a module's
    are not (its weights are no input)."""
    elements = 0
    for value in values:
        shape = getattr(value, "shape", None)
        if shape is not None and hasattr(value, "dim"):
            dims = [int(n) for n in shape]
            counts.update(dims)
            if len(dims) >= 2:
                counts.add(dims[0] * dims[1])
            elif len(dims) == 1 and dims[0] > 1 and not value.is_floating_point():
                counts.add(dims[0] - 1)
            size = 1
            for n in dims:
                size *= n
            elements += size
        elif depth < 3 and isinstance(value, (list, tuple)):
            counts.add(len(value))
            walked = value[:ITEMS_WALKED]
            part = _counts(walked, depth + 1, counts)
            elements += part * len(value) // max(1, len(walked))
        elif depth < 3 and hasattr(value, "keys") and hasattr(value, "values"):
            elements += _counts(tuple(value.values()), depth + 1, counts)
        elif depth < 3 and hasattr(value, "__dict__") and not hasattr(value, "_parameters"):
            for name in ("num_graphs", "batch_size"):  # a batch object (a graph library's) says how many it holds
                try:
                    number = getattr(value, name, None)
                except Exception:  # a property that computes, and fails
                    number = None
                if isinstance(number, int) and not isinstance(number, bool):
                    counts.add(number)
            elements += _counts(tuple(vars(value).values()), depth + 1, counts)
    return elements
