"""child.framework.hf_trainer_runner.unwrapped: an out-of-memory error a wrapper re-raised as its cause is classified as itself."""

from __future__ import annotations

from isoprobe.child.framework.hf_trainer_runner import unwrapped


class WrapperError(Exception):
    """What a library raises around the real failure (``raise WrapperError(...) from oom``)."""


def raised(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise WrapperError("the training loop failed") from exc
    except WrapperError as outer:
        return outer


def test_the_out_of_memory_cause_is_what_is_classified():
    oom = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1048576 bytes")
    assert unwrapped(raised(oom)) is oom


def test_a_wrapped_bug_stays_the_wrapper():
    outer = raised(ValueError("no such head"))
    assert unwrapped(outer) is outer


def test_a_plain_out_of_memory_is_itself():
    oom = MemoryError()
    assert unwrapped(oom) is oom
