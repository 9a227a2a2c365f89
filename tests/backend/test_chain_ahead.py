"""The MTP chain step launched ahead (``serving.speculation.chain_ahead``): packed with the verify
step's lengths before it and shifted on the device by its acceptance, it is the step a proposal
after the read would make; the engine's outputs, drafts and acceptance do not change."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from serving.engine.model_runner import StepOutputs
from serving.kv.batch import PackedStep, StepBatch, StepEntry, StepLayout, StepShape
from serving.model.presets import random_model
from serving.speculation.chain_ahead import ChainAhead, shift_by_acceptance
from serving.speculation.tree import pending
from serving.stack import ServingConfig, build_engine

PROMPTS = [[1, 2, 3, 4, 5], list(range(20, 47)), [7, 8, 9] * 6]
MAX_NEW = 8


@pytest.fixture(scope="module")
def model():
    return random_model("tiny", seed=5, num_nextn_predict_layers=1)


def _chain_step(rows, lengths, owners, chain, slot=300, firsts=None):
    return StepBatch("verify", [
        StepEntry(rows[o], lengths[o], list(range(slot + i * chain, slot + (i + 1) * chain)),
                  [firsts[i] if firsts else 0] + [0] * (chain - 1), list(range(lengths[o], lengths[o] + chain)),
                  list(range(-1, chain - 1)), hidden_src=rows[o])
        for i, o in enumerate(owners)
    ], mtp="chain")


@pytest.mark.parametrize("fused,on", [(False, "cpu"), (True, "cpu"), pytest.param(True, "cuda", marks=pytest.mark.gpu)],
                         ids=["torch", "triton", "triton-cuda"])
@pytest.mark.parametrize("requests,width,chain,padded,order", [(1, 1, 2, 1, "drafter"), (3, 2, 3, 8, "drafter"),
                                                                (2, 4, 2, 8, "drafter"), (5, 1, 1, 8, "drafter"),
                                                                (3, 2, 3, 8, "shuffled"), (1, 4, 3, 4, "shuffled")])
def test_shift_makes_the_step_a_proposal_after_the_read_would_make(requests, width, chain, padded, order, fused, on):
    """Every packed field of the shifted step (in a padded bucket layout) equals that of the chain step
    packed on the host from the lengths and first tokens after the verify step: through torch's
    kernels and through the one Triton program (the interpreter on the CPU), with the drafter's
    entry order (no index copied) and with entries in any order."""
    if on == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rng = random.Random(requests * 100 + width * 10 + chain)
    rows = rng.sample(range(1, 50), requests)
    lengths = [rng.randrange(0, 500) for _ in range(requests)]
    verify_width, topk, batch = 6, width, requests + 1  # the verify step padded too
    shape = StepShape("verify", None, verify_width, topk, True, "after")
    verify = StepBatch("verify", [StepEntry(r, n, [1] * 2, [5, 6], [n, n + 1], [-1, 0]) for r, n in zip(rows, lengths)],
                       accept=True, mtp="after", topk=topk)
    n_acc = [rng.randrange(0, verify_width) for _ in range(batch)]
    mtp_topk = [rng.randrange(1, 1000) for _ in range(batch * topk)]
    ints = torch.tensor([rng.randrange(-9, 9) for _ in range(batch * verify_width)] + n_acc
                        + [rng.randrange(9) for _ in range(batch + batch * verify_width)] + mtp_topk + [0] * 40)
    outputs = StepOutputs(verify, ints.to(on), shape, batch * verify_width, batch)
    owners = [b for b in range(requests) for _ in range(width)]
    choices = [i % width for i in range(len(owners))]
    if order == "shuffled":
        pairs = list(zip(owners, choices))
        rng.shuffle(pairs)
        pairs = pairs[::-1] if pairs == sorted(pairs) else pairs  # never the drafter's order
        owners, choices = [o for o, _ in pairs], [c for _, c in pairs]

    layout = StepLayout(batch=padded * width, tokens=padded * width * chain, tails=padded * width * chain,
                        mask=padded * width * chain * chain, width=chain, kv=10_000)
    before = _chain_step(rows, lengths, owners, chain)
    packed = PackedStep.allocate(layout, pin=False)
    packed.fill(before)
    device = packed.host.clone().to(on)
    views = packed.views(device)

    class Batch:
        fields = views

    shift_by_acceptance(outputs, owners, choices, chain, fused=fused)(Batch())
    after_lengths = [n + a + 1 for n, a in zip(lengths, n_acc)]
    firsts = [mtp_topk[o * topk + c] for o, c in zip(owners, choices)]
    want = PackedStep.allocate(layout, pin=False)
    want.fill(_chain_step(rows, after_lengths, owners, chain, firsts=firsts))
    for name, (start, count, dtype) in want.offsets.items():
        assert torch.equal(views[name].cpu(), want.views(want.host)[name]), name


# Compiled in a child process: the suite runs Triton's interpreter, which never compiles.
_COMPILE_SHIFT_FOR_HOPPER = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from serving.speculation.chain_ahead import _shift_kernel as kernel
pointers = {"INTS": "*i64", "INDEX": "*i64", "PREFIX": "*i64", "POS": "*i64", "KV_INDPTR": "*i32", "IDS": "*i64"}
signature = {n: "constexpr" if n.isupper() and n not in pointers else pointers.get(n, "i32") for n in kernel.arg_names}
for closed in (True, False):
    src = ASTSource(kernel, signature=signature, constexprs={"CLOSED": closed, "BLOCK_E": 256, "BLOCK_R": 256})
    triton.compile(src, target=GPUTarget("cuda", 90, 128))
"""


def test_shift_kernel_compiles_for_hopper():
    """The shift's Triton program compiles for sm_90 in both layouts (no GPU needed)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _COMPILE_SHIFT_FOR_HOPPER], env=env, cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def test_shift_refuses_what_it_cannot_index():
    shape = StepShape("verify", None, 4, 2, True, "after")
    verify = StepBatch("verify", [StepEntry(1, 3, [1], [5], [3], [-1])], accept=True, mtp="after", topk=2)
    outputs = StepOutputs(verify, torch.zeros(64, dtype=torch.long), shape, 4, 1)
    with pytest.raises(ValueError, match=r"candidate index in \[0, 2\)"):
        shift_by_acceptance(outputs, [0], [2], 2)
    with pytest.raises(ValueError, match="owners among the verify step's 1 entries"):
        shift_by_acceptance(outputs, [1], [0], 2)
    plain = StepOutputs(verify, torch.zeros(8, dtype=torch.long), StepShape("verify", None, 4, 0, True), 4, 1)
    with pytest.raises(ValueError, match="mtp_topk"):
        shift_by_acceptance(plain, [0], [0], 2)


def test_a_launch_serves_only_its_runner_at_its_generation_and_rows():
    runner, other = SimpleNamespace(generation=3), SimpleNamespace(generation=3)
    ahead = ChainAhead(torch.zeros(8, dtype=torch.long), runner, 3, {5: 0, 9: 2}, 2)
    assert ahead.serves(runner, [9, 5]) and ahead.serves(runner, [5])
    assert not ahead.serves(other, [5])  # another runner at the same count
    assert not ahead.serves(runner, [5, 7])  # a request it did not draft for
    runner.generation = 4
    assert not ahead.serves(runner, [5])  # a step ran since
    assert ahead.paths(9, [11, 12]) == [[11, pending(4), pending(5)], [12, pending(6), pending(7)]]


def _engine(model, spec, ahead=True):
    pool = model.new_pool(2048, torch.bfloat16, max_requests=8, max_context=256)
    config = ServingConfig(backend="kernel", speculate=spec, pool_slots=pool.num_slots, cuda_graphs=True,
                           capture_graphs=model.device.type == "cuda", graph_batch_sizes=(1, 4))
    eng = build_engine(config, model, pool).engine
    if eng.drafter is not None:
        eng.drafter.ahead = ahead
    return eng


def _drafts_per_step(eng):
    """Record every proposal's trees, read on the host (a sync the engine does not make)."""
    drafted, propose = [], eng.drafter.propose

    def recording(ctx, requests):
        trees = propose(ctx, requests)
        drafted.append([t.read().tokens if t.has_pending else t.tokens for t in trees])
        return trees

    eng.drafter.propose = recording
    return drafted


def _same_as_serial(model, spec, prompts, max_new):
    plain = _engine(model, None).generate(prompts, max_new)
    runs = {}
    for ahead in (False, True):
        eng = _engine(model, spec, ahead)
        drafted = _drafts_per_step(eng)
        reqs = eng.generate(prompts, max_new)
        assert [r.output for r in reqs] == [r.output for r in plain]
        assert eng.pool.leaked_slots() == 0
        runs[ahead] = (drafted, eng.stats.accepted_drafts, eng.stats.steps, eng.drafter)
    assert runs[True][:3] == runs[False][:3]  # the same drafts at every step, the same acceptance
    assert runs[False][3].proposals_ahead == 0
    return runs[True][3]


@pytest.mark.parametrize("spec,prompts", [("mtp:1x4", PROMPTS[:1]), ("mtp:2x3", [PROMPTS[0], PROMPTS[2]])])
def test_drafts_launched_ahead_are_the_serial_drafts(model, spec, prompts, monkeypatch):
    """One and two requests, chain and tree: every proposal after the first takes the chain step
    launched behind the verify step (steps planned on the device: the Triton path here)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    drafter = _same_as_serial(model, spec, prompts, MAX_NEW)
    assert drafter.launches_ahead > 0 and drafter.proposals_ahead > 0


def test_a_launch_ahead_is_dropped_when_a_prefill_comes_between(model, monkeypatch):
    """A request prefilled between two steps (it may take a finished request's table row): the next
    proposal launches its own chain step, and both requests decode as plain greedy decoding does."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    plain = _engine(model, None).generate(PROMPTS[:2], MAX_NEW)
    eng = _engine(model, "mtp:1x3")
    first = eng.add_request(PROMPTS[0], MAX_NEW)
    eng.prefill(first)
    for _ in range(2):
        eng.step([first])
    taken = eng.drafter.proposals_ahead
    assert taken >= 1 and eng.drafter._launched is not None
    second = eng.add_request(PROMPTS[1], MAX_NEW)
    eng.prefill(second)
    eng.step([first, second])
    assert eng.drafter.proposals_ahead == taken  # dropped, drafted afresh
    while not (first.finished and second.finished):
        eng.step([first, second])
    assert [first.output, second.output] == [r.output for r in plain]
    assert eng.pool.leaked_slots() == 0


def test_launch_refuses_an_adjusted_step_planned_on_the_host(model):
    pool = model.new_pool(256, torch.float32, max_requests=4, max_context=64)
    eng = build_engine(ServingConfig(backend="reference", speculate="mtp:1x3", pool_slots=pool.num_slots), model, pool).engine
    step = _chain_step([1], [0], [0], 2, slot=10)
    with pytest.raises(ValueError, match="plans on the device"):
        eng.runner.launch(step, adjust=lambda batch: None)
    adjusted = []
    assert eng.runner.launch(step, adjust=adjusted.append, or_none=True) is None and adjusted == []
    assert eng.drafter.launch_ahead is not None


@pytest.mark.gpu
@pytest.mark.parametrize("spec,prompts", [("mtp:1x3", PROMPTS[:1]), ("mtp:1x3", PROMPTS[:2]), ("mtp:4x3", PROMPTS[:1])])
def test_captured_drafts_launched_ahead_are_the_serial_drafts(spec, prompts):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gpu = random_model("tiny", device="cuda", dtype=torch.bfloat16, seed=5, num_nextn_predict_layers=1)
    drafter = _same_as_serial(gpu, spec, prompts, 24)
    # Every draft bucket plans uniformly, on the device, on every path: the tree and two requests' chains too.
    assert drafter.proposals_ahead > 0
