"""The Lightning pieces that need no trial: the spec the callback builds from a Trainer, the init arguments it
rebuilds a module with, and the unwrapping of an exception Lightning raised in place of the user's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")
import lightning as L  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))
from lightning_models import HogModule, NoBatchSize, RandomFeatures  # noqa: E402

from isoprobe.child.framework.lightning_runner import (  # noqa: E402
    batch_problem, batch_size_holders, leading_sizes, loader_facts, original)
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


def test_the_batch_that_arrives_is_judged_against_the_batch_set():
    """Issue 34: a train_dataloader() with a batch size of its own made 'batch 32 fits' a verdict on batch 12.
    The trial judges each batch that arrives: a tensor with the batch's rows, else a loader that was built with
    it (a partial last batch, a layout whose first dimension is not the batch); never a loader built with another
    size, and never a dataset smaller than the batch (no batch of that size exists in it)."""
    assert batch_problem(32, [32, 32], 32, 4096, 0) is None
    assert batch_problem(32, [12, 12], 12, 4096, 0)[0].startswith(
        "its train_dataloader() gave a batch of 12 samples where the trial set the batch size to 32: a DataLoader "
        "with batch_size=12")
    assert batch_problem(32, [64, 64], 64, 4096, 3) is not None  # larger than asked: never a partial batch
    assert batch_problem(32, [12, 12], None, None, 0) is not None  # an unknown loader's first batch must be it
    assert batch_problem(32, [12, 12], None, None, 5) is None  # ... its later, smaller one may be the epoch's last
    assert batch_problem(32, [8], 32, 4104, 128) is None  # the loader's partial last batch
    assert batch_problem(32, [128, 128], 32, 4096, 0) is None  # time-major (T, B): the loader was built with 32
    problem, samples = batch_problem(32, [12, 12], 32, 12, 0)
    assert samples == 12 and "holds 12 samples, fewer than the batch 32" in problem
    assert batch_problem(32, [], None, None, 0) is None  # no tensor: nothing to judge


def test_a_batchs_rows_and_a_loaders_batch_are_read_where_they_are():
    import dataclasses

    import torch
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    @dataclasses.dataclass
    class Batch:
        ids: torch.Tensor
        scalar: torch.Tensor

    batch = ({"x": torch.zeros(5, 3), "meta": [torch.zeros(5)]}, Batch(torch.zeros(5, 2), torch.tensor(1.0)))
    assert leading_sizes(torch, batch) == [5, 5, 5]  # the 0-d tensor has no rows
    data = RandomFeatures(20, 4, 2)
    assert loader_facts(DataLoader(data, batch_size=6)) == (6, 20)
    assert loader_facts(DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(range(7)), 3, False))) == (3, 7)
    assert loader_facts([torch.zeros(2)]) == (None, None)  # not a DataLoader: it does not say
