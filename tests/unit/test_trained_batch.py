"""Did a command trial train at the batch it was asked for (issues 47 and 56)? The judge in the trial, the shim's
record of the model's training forwards that it judges (in a real torch process), and the rule across trials.

Why: a script that ignores ``{batch_size}``, or finds its own batch by catching its out-of-memory error, turned
every trial into a credit for a batch it never ran (16777216 "fits"; 802 "fits" where the script trains at 100).
Issue 47's one shape rule then refused real scripts that train at their batch (two views, a list of images, one
forward per image, micro-batches of 2, [B*T, F], packed sequences, a token budget, a graph network), and credited a
script that trained at B in its first step only and at 8 afterwards (161).
"""

from __future__ import annotations

import json

import pytest

from isoprobe.child.command_trial.verdicts import step_inputs
from isoprobe.child.command_trial.trained_batch import StepInputs, judge, step_shows
from isoprobe.protocol.command import ShimStep
from isoprobe.report.batch_check import BatchCheck, contradiction, contradiction_message, unclear_note
from shim_run import shim_lines


def step(*forwards, count=0, elements=0, leading=0, counts=(), tried=()):
    return StepInputs(forwards=[list(f) for f in forwards], forward_count=count, input_elements=elements,
                      leading_sum=leading, batch_counts=list(counts), tried_counts=list(tried))


@pytest.mark.parametrize("batch, inputs, world, shown", [
    (64, step([64, 3, 32, 32]), 1, True),                        # the model's input, batch first
    (64, step([128, 64, 512]), 1, True),                         # sequence first (an RNN without batch_first)
    (64, step([24, 3, 32, 32]), 1, False),                       # a fixed batch that ignores the argument
    (64, step([16, 128], [16, 128], [16, 128], [16, 128]), 1, True),  # four micro-batches of 16
    (4096, step([8, 512]), 1, True),                             # a batch counted in tokens: 8 sequences of 512
    (64, step([32, 3, 32, 32]), 2, True),                        # a global batch split over two ranks
    (64, step([128, 3, 32, 32]), 1, True),                       # two views of the batch, concatenated
    (64, step([64 * 77, 256]), 1, True),                         # a per-token model on [B*T, F]
    (64, step([3, 224, 224], count=64, leading=192), 1, True),   # one forward per image, unbatched
    (64, step([2, 8], count=32, leading=64), 1, True),           # micro-batches of 2, 32 of them
    (64, step([3, 224, 224], counts=[3, 224, 64]), 1, True),     # a detection model's list of 64 images
    (64, step([1, 5071], counts=[1, 5071, 65, 64]), 1, True),    # packed sequences with cu_seqlens [B+1]
    (64, step([1, 5071], counts=[1, 5071]), 1, False),           # packed, no offsets: the check cannot tell
    (4096, step([15, 270], counts=[15, 270, 4050]), 1, False),   # a token budget of 4096: 4050 tokens
])
def test_where_a_step_shows_its_batch(batch, inputs, world, shown):
    assert (step_shows(batch, inputs, world) is not None) is shown


def test_a_trial_is_trained_unclear_or_not_judged_and_never_refused_for_an_unclear_reading():
    assert judge(100, [[step([100, 8]), step([100, 8]), step([37, 8])]]).check.verdict == "trained"
    unclear = judge(100, [[step([1, 5071], elements=5071)] * 5])
    assert unclear.check.verdict == "unclear" and unclear.trained_once is None
    assert unclear.check.input_elements == 5071 and unclear.check.shapes == [[1, 5071]]
    assert judge(100, [[step(), step()]]).check is None


def test_a_script_that_trains_at_its_batch_only_in_its_first_step_is_named():
    # Red team: batch 161 asked, the first step at 161, every later one at 8: issue 47's check credited it.
    steps = [step([161, 32], elements=161 * 32)] + [step([8, 32], elements=8 * 32)] * 5
    judgement = judge(161, [steps])
    assert judgement.trained_once is not None
    assert "first 1 optimizer step(s) only" in judgement.trained_once and "[8, 32]" in judgement.trained_once
    # The last batch of an epoch is short once, not for two steps in a row: credited.
    epoch = [step([161, 32], elements=161 * 32), step([161, 32], elements=161 * 32), step([40, 32], elements=40 * 32)]
    assert judge(161, [epoch * 3]).trained_once is None
    assert judge(161, [[step([161, 32], elements=161 * 32)] * 2 + [step([8, 32], elements=256)]]).trained_once is None


def check(verdict, elements, *shapes):
    return BatchCheck(verdict=verdict, input_elements=elements, shapes=[list(s) for s in shapes])


def test_trials_whose_larger_batch_took_no_more_input_prove_the_script_ignores_it():
    fixed = check("unclear", 24 * 3 * 64 * 64, [24, 3, 64, 64])
    # A fixed batch of 24 asked for 512 and 1024; a halving finder that settled on 100 from 802 and from 1604.
    found = contradiction(1024, fixed, [(512, fixed)])
    assert found is not None and found[0] == 1024 and found[2] == 512
    settled = check("unclear", 100 * 3 * 64 * 64, [100, 3, 64, 64])
    assert contradiction(802, settled, [(1604, settled)])[0] == 1604
    # A fixed 24 matched by chance (64 is an image side) at 32 and 64: exact shapes compare even that small.
    matched = check("trained", 24 * 3 * 64 * 64, [24, 3, 64, 64])
    assert contradiction(64, matched, [(32, matched)]) is not None
    text = contradiction_message(1024, 512, fixed, fixed, "{batch_size}")
    assert "batch 1024" in text and "batch 512" in text and "batch_check: off" in text


def test_a_larger_batch_that_took_much_less_per_sample_than_an_exact_smaller_one_is_contradicted():
    # A halving finder asked 4342 trains at 1085: the batch_check trial at 1085 reads it exactly.
    per_sample = 2 * 3 * 64 * 64
    exact = check("trained", 1085 * per_sample, [1085, 3, 64, 64])
    assert contradiction(4342, check("unclear", 1085 * per_sample), [(1085, exact)])[0] == 4342
    # Accelerate's finder from 4096 settles at 1425: more input than at 1024, far less per sample.
    assert contradiction(4096, check("unclear", 1425 * per_sample), [(1024, check("trained", 1024 * per_sample))])
    # A script that trains at its batch, its samples of varied size: within half per sample, never refused.
    assert contradiction(4096, check("unclear", 4096 * per_sample * 7 // 10),
                         [(1024, check("trained", 1024 * per_sample))]) is None
    # The per-sample rule needs an exact reading at 8 or more on the smaller side.
    assert contradiction(64, check("unclear", 64 * 100), [(16, check("unclear", 16 * 300))]) is None
    assert contradiction(64, check("unclear", 64 * 100), [(4, check("trained", 4 * 300))]) is None


def test_trials_of_a_script_that_trains_at_its_batch_are_never_contradicted():
    # Packed sequences of random lengths: more tokens at a larger batch, but not exactly in proportion.
    packed = [(8, check("unclear", 5000)), (16, check("unclear", 8100)), (24, check("unclear", 7900)),
              (32, check("unclear", 15800))]
    for batch, record in packed:
        assert contradiction(batch, record, [p for p in packed if p[0] != batch]) is None
    # One long sequence can outweigh two short ones: not compared below batch 8 unless both are exact.
    assert contradiction(2, check("unclear", 900), [(1, check("unclear", 1000))]) is None
    # A check that is off, or saw no tensor, compares with nothing.
    assert contradiction(1024, check("off", None), [(512, check("off", None))]) is None
    assert contradiction(1024, check("unclear", None), [(512, check("unclear", None))]) is None


def test_the_answers_note_names_the_batch_and_the_way_out():
    note = unclear_note(58, check("unclear", 5071, [1, 5071]))
    assert "58" in note and "[1, 5071]" in note and "batch_check: off" in note


B = 12
SHAPES_SCRIPT = r"""
import copy, torch, torch.nn as nn
B = %d
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(self, features=8):
        super().__init__(); self.lin = nn.Linear(features, 4)
    def forward(self, x, cu_seqlens=None):
        return self.lin(x)
class Det(nn.Module):
    def __init__(self):
        super().__init__(); self.conv = nn.Conv2d(3, 4, 3)
    def forward(self, images, targets=None):
        return sum(self.conv(i.unsqueeze(0)).sum() for i in images)
class Gnn(nn.Module):
    def __init__(self):
        super().__init__(); self.lin = nn.Linear(8, 4)
    def forward(self, x, edge_index, batch):
        return self.lin(x)
class GraphBatch:
    def __init__(self, x, num_graphs):
        self.x = x; self.num_graphs = num_graphs
class GnnOnObject(nn.Module):
    def __init__(self):
        super().__init__(); self.lin = nn.Linear(8, 4)
    def forward(self, data):
        return self.lin(data.x)
net, det, gnn, gnn2 = Net(), Det(), Gnn(), GnnOnObject()
ema = copy.deepcopy(net)
everything = [p for m in (net, det, gnn, gnn2, ema) for p in m.parameters()]
opt = torch.optim.SGD(everything, lr=0.01)
def one(loss):
    loss.backward(); opt.step(); opt.zero_grad()
x = torch.randn(B, 8)
one(net(torch.cat([x, x.flip(0)])).sum())                            # contrastive: two views, [2B, 8]
one(net(torch.randn(B + 2 * 3 * B, 8)).sum())                        # FixMatch: B labelled + weak and strong 3B
one(det([torch.randn(3, 16, 16) for _ in range(B)], [{"boxes": torch.zeros(2, 4)}] * B))  # a list of B images
one(sum(net(torch.randn(8)).sum() for _ in range(B)))                # one forward per sample
one(net(x).sum() + ema(x[: B // 3]).sum())                           # an EMA copy run on a sub-batch, after
one(net(torch.randn(B * 7, 8)).sum())                                # per token: [B*T, F]
for _ in range(B // 2):                                              # micro-batches of 2
    net(torch.randn(2, 8)).sum().backward()
opt.step(); opt.zero_grad()
lengths = [5, 9, 7, 11, 6, 8, 10, 5, 9, 7, 6, 8][:B]
offsets = torch.tensor([0] + [sum(lengths[: k + 1]) for k in range(B)], dtype=torch.int32)
one(net(torch.randn(1, sum(lengths), 8), cu_seqlens=offsets).sum())  # packed, with offsets [B+1]
one(net(torch.randn(1, sum(lengths) + 2, 8)).sum())                  # packed, no offsets
one(gnn(torch.randn(5 * B + 1, 8), torch.zeros(2, 40, dtype=torch.long), torch.zeros(5 * B + 1, dtype=torch.long)).sum())
one(gnn2(GraphBatch(torch.randn(5 * B + 1, 8), B)).sum())            # a graph library's batch object
""" % B

#: Each step of SHAPES_SCRIPT, and whether batch B shows in it.
EXPECTED = ["contrastive", "fixmatch", "detection list", "per sample", "ema sub-batch", "per token",
            "micro-batches of 2", "packed with offsets", None, None, "batch object"]


def test_the_shim_reads_the_batch_of_every_shape_a_real_script_trains_at(tmp_path):
    steps = [step_inputs(line) for line in shim_lines(tmp_path, SHAPES_SCRIPT, ShimStep)]
    assert len(steps) == len(EXPECTED)
    shown = [name if step_shows(B, s) is not None else None for name, s in zip(EXPECTED, steps)]
    assert shown == EXPECTED, json.dumps([s.__dict__ for s in steps], default=list)
    assert all(s.input_elements > 0 and s.forward_count >= 1 for s in steps)
    assert steps[3].forward_count == B and steps[6].leading_sum == B and steps[2].input_elements == B * 3 * 16 * 16 + B * 8


SCRIPT = r"""
import torch, torch.nn as nn, torch.nn.functional as F
model = nn.Sequential(nn.Linear(8, 4))
teacher = nn.Linear(8, 4).requires_grad_(False)
loss_module = nn.CrossEntropyLoss()
class Keywords(nn.Module):
    def __init__(self):
        super().__init__(); self.inner = nn.Linear(8, 4)
    def forward(self, input_ids=None):
        return self.inner(input_ids)
kw = Keywords()
class Fails(nn.Module):
    def __init__(self):
        super().__init__(); self.inner = nn.Linear(8, 4)
    def forward(self, x):
        self.inner(x)
        raise MemoryError("no room")
fails = Fails()
opt = torch.optim.SGD([*model.parameters(), *kw.parameters(), *fails.parameters()], lr=0.1)
x = torch.randn(5, 8)
with torch.no_grad():
    model(torch.randn(9, 8))           # evaluation: not a training forward
teacher(torch.randn(11, 8))            # frozen: not the model
try:
    fails(torch.randn(13, 8))          # ran out inside its forward: not completed
except MemoryError:
    pass
loss = loss_module(model(x), torch.zeros(5, dtype=torch.long))  # the loss module has no parameters
loss.backward(); opt.step()
kw(input_ids=torch.randn(6, 8)).sum().backward(); opt.step()   # model(**batch), as HF models are called
opt.step()                                                       # no forward since the step before
"""


def test_the_shim_records_the_models_completed_training_forwards_and_nothing_else(tmp_path):
    steps = shim_lines(tmp_path, SCRIPT, ShimStep)
    assert [step.forwards for step in steps] == [[[5, 8]], [[6, 8]], []]
    assert [(s.forward_count, s.input_elements) for s in steps] == [(1, 40), (1, 48), (0, 0)]


def test_a_finder_that_tried_the_batch_and_went_on_at_another_is_refused():
    # Accelerate's find_executable_batch_size from 4096: its first forward ran out, it trains at 1425 (issue 56:
    # trials at 4096..4119 sat too close together for the rule across trials, and 4116 was answered).
    first = step([1425, 3, 64, 64], elements=1425 * 12288, counts=[3, 64, 1425, 4275], tried=[3, 64, 4096, 1425])
    later = step([1425, 3, 64, 64], elements=1425 * 12288, counts=[3, 64, 1425, 4275], tried=[3, 64, 1425])
    judgement = judge(4096, [[first, later, later]])
    assert judgement.check.verdict == "unclear" and judgement.trained_once is not None
    assert "batch of 4096 in step 1" in judgement.trained_once and "[1425, 3, 64, 64]" in judgement.trained_once
    # Micro-batches show B by their sum, not in any one forward: nothing tried, nothing refused.
    assert judge(64, [[step([2, 8], count=32, leading=64, counts=[2, 8], tried=[2, 8])] * 3]).trained_once is None


FINDER_SCRIPT = r"""
import torch, torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__(); self.lin = nn.Linear(5, 4)
    def forward(self, x):
        if x.shape[0] > 6:
            raise MemoryError("no room")               # out of memory inside the forward
        return self.lin(x)
net = Net(); opt = torch.optim.SGD(net.parameters(), lr=0.1)
for batch in (12, 6):                                  # a halving finder's first attempt, then its batch
    try:
        net(torch.randn(batch, 5)).sum().backward(); opt.step(); opt.zero_grad()
        break
    except MemoryError:
        pass
net(torch.randn(6, 5)).sum().backward(); opt.step()
"""


def test_the_shim_keeps_a_forward_that_raised_as_tried_not_as_trained(tmp_path):
    steps = shim_lines(tmp_path, FINDER_SCRIPT, ShimStep)
    assert [(12 in s.tried_counts, 12 in s.batch_counts, 6 in s.batch_counts) for s in steps] == [
        (True, False, True), (False, False, True)]
    assert judge(12, [[step_inputs(s) for s in steps]]).trained_once is not None
