"""Running one request in this process (a trial, or the environment check), and leaving fast.

Shared by the entry (``main``: a spawned or warm child) and the fork server
(``server``: each fork runs its order through ``run_request``). Stdlib only at
import (see ``main``): the trial's code is imported when a request comes.
"""

from __future__ import annotations

import importlib
import os
import sys

from isoprobe.child.events import Events
from isoprobe.child.own_modules import credit_own, import_own


def cuda_initialized() -> bool:
    """Whether this process has a CUDA context (without creating one): torch's lazy initialisation ran."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def driver_initialised(maps_path: str = "/proc/self/maps") -> bool:
    """Whether this process initialised CUDA's driver (without initialising it): a fork would inherit it.

    ``torch.cuda.is_initialized()`` says only whether torch's lazy initialisation ran. ``torch.cuda.is_available()``
    does not run it, but it calls ``cudaGetDeviceCount``, which loads the driver and runs ``cuInit`` (torch's own
    comment in ``is_available``), and a fork of that process fails its first CUDA call ("CUDA error:
    initialization error", or torch's "Cannot re-initialize CUDA in forked subprocess"). Any preloaded module with a
    module-level ``"cuda" if torch.cuda.is_available()`` does that. torch's libraries do not link the driver
    (``libcuda.so``: not among libtorch_cuda's or libc10_cuda's NEEDED entries; the runtime loads it on its first
    call), so the driver mapped into this process is the sign. A process that only loaded the driver holds no
    memory on a card (no context): a spawned spare may run its trial; a fork server must not fork.
    """
    return cuda_initialized() or driver_loaded(maps_path)


def driver_loaded(maps_path: str = "/proc/self/maps") -> bool:
    """Whether CUDA's driver library (``libcuda.so``) is mapped into this process: the runtime loaded it."""
    try:
        with open(maps_path) as maps:
            return any("/libcuda.so" in line for line in maps)
    except OSError:  # no /proc: nothing to read, nothing claimed
        return False


def run_request(request_path: str, events: Events) -> None:
    """Read the request and run it: a trial, or the environment check (imported only for it: a trial does not
    carry its code)."""
    from isoprobe.child.core.trial import run_trial
    from isoprobe.protocol.messages import InspectRequest, read_request

    read = []
    import_own(lambda: read.append(read_request(request_path)))  # the typed spec is isoprobe's, not the user's
    [request] = read
    if isinstance(request, InspectRequest):
        # Counted as the others are, so that the import baseline the check reports is a plain process's.
        import_own(lambda: importlib.import_module("isoprobe.child.environment_check"))
    credit_own()  # the last of isoprobe's own is in: the cap is final before the user's code runs
    if isinstance(request, InspectRequest):
        from isoprobe.child.environment_check import run_inspect

        run_inspect(request, events)
    else:
        run_trial(request, events)
    sys.stdout.flush()


def exit_now(status: int) -> None:
    """Leave without the interpreter's teardown: the verdict is written, and tearing down torch costs ~1 s.

    Nothing is lost: events go out with unbuffered ``os.write``, and the standard
    streams are flushed here. (A crash during a slow teardown would also turn a
    written 'fits' into 'crashed', which is correct but wasteful.)
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
