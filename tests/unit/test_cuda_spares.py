"""issue 45, item 11: a warm spare whose imports created a CUDA context is not used, and the probe starts its
trials cold from then on (its context sat on the card beside the running trial, and every spare's would again).
A spare that only loaded the driver (``torch.cuda.is_available()``) holds no memory on a card and is used."""

from __future__ import annotations

from isoprobe.executors import Conditions
from isoprobe.executors.child_process import StartedChild
from isoprobe.executors.local import LocalExecutor
from isoprobe.protocol.messages import Warm


def _spare(tmp_path, backend: str, context: bool) -> StartedChild:
    events = tmp_path / f"events-{backend}-{context}.jsonl"
    warm = Warm(modules=["torch"], seconds=2.0, cuda_initialized=context, idle_priority=True)
    events.write_text(warm.model_dump_json() + "\n")
    return StartedChild(process=None, lifeline_write=-1, events_path=events, stderr_path=tmp_path / "stderr",
                        conditions=Conditions(backend=backend), warm=True)


def test_a_cuda_spare_with_a_context_is_dropped_and_the_probe_starts_cold(tmp_path, capsys):
    executor = LocalExecutor(tmp_path, warm=True)
    try:
        assert not executor._made_a_context(_spare(tmp_path, "cuda", context=False))
        assert not executor._made_a_context(_spare(tmp_path, "cpu", context=True))
        assert executor.warm
        assert executor._made_a_context(_spare(tmp_path, "cuda", context=True))
        assert not executor.warm
        assert "created a CUDA context while importing" in capsys.readouterr().err
    finally:
        executor.close()
