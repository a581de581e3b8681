"""The Lightning pieces that need no trial: the spec the callback builds from a Trainer, the init arguments it
rebuilds a module with, and the unwrapping of an exception Lightning raised in place of the user's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
import lightning as L  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lightning_models import HogModule, NoBatchSize  # noqa: E402

from isoprobe.child.lightning_runner import batch_size_holders, original  # noqa: E402
from isoprobe.lightning import init_arguments, reference, spec_for  # noqa: E402
from isoprobe.spec.load import load_spec  # noqa: E402


def test_the_callbacks_spec_is_the_trainers_memory_settings_and_loads():
    module = HogModule(features=64, depth=2)
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", gradient_clip_val=0.5,
                        gradient_clip_algorithm="value", accumulate_grad_batches=4, logger=False)
    spec = spec_for(trainer, module)
    assert spec["model"]["lightning"].endswith("lightning_models.py:HogModule")
    assert spec["model"]["kwargs"] == {"features": 64, "depth": 2, "classes": 10, "batch_size": 2, "samples": 4096,
                                       "fail": False, "check_batch": None,
                                       "count_file": None}
    assert spec["training"] == {"precision": "bf16-mixed"} and spec["device"] == "cpu"
    assert spec["lightning"] == {"accumulate_grad_batches": 4, "batch_arg_name": "batch_size",
                                 "gradient_clip_val": 0.5, "gradient_clip_algorithm": "value"}
    loaded = load_spec(spec)
    assert loaded.lightning.accumulate_grad_batches == 4 and loaded.training.precision == "bf16-mixed"


def test_a_precision_isoprobe_does_not_run_is_named():
    trainer = L.Trainer(accelerator="cpu", precision="64-true", logger=False)
    with pytest.raises(ValueError, match="precision '64-true' is not probed"):
        spec_for(trainer, HogModule(features=8))


class Unsaved(L.LightningModule):
    def __init__(self, width: int, depth: int = 2):
        super().__init__()


def test_a_module_that_saved_no_hyperparameters_needs_them_given():
    with pytest.raises(ValueError, match=r"Unsaved needs width .*save_hyperparameters\(\).*module_kwargs"):
        init_arguments(Unsaved(3), None, "module_kwargs")
    assert init_arguments(Unsaved(3), {"width": 3}, "module_kwargs") == {"width": 3}


def test_a_class_inside_a_function_cannot_be_imported_by_a_child():
    class Local(L.LightningModule):
        pass

    with pytest.raises(ValueError, match="define it at the top level"):
        reference(Local)
    assert reference(Unsaved) == f"{__file__}:Unsaved"  # a single file's class: by its path


def test_the_holders_are_where_lightning_setattr_looks():
    assert batch_size_holders(HogModule(features=8), None, "batch_size") == ["module.hparams.batch_size"]
    assert batch_size_holders(NoBatchSize(), None, "batch_size") == []


class LightningWrapper(Exception):
    pass


LightningWrapper.__module__ = "lightning.pytorch.utilities.exceptions"


def test_an_exception_lightning_raised_for_the_users_is_unwrapped_to_it():
    try:
        try:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        except RuntimeError as inner:
            raise LightningWrapper("while training") from inner
    except LightningWrapper as wrapped:
        assert isinstance(original(wrapped), RuntimeError)
    plain = ValueError("the user's own")
    assert original(plain) is plain
