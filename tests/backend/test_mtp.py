"""DeepSeek's MTP module as the drafter: loaded as DeepSeek lays it out, computed as transformers'
own block computes it, its latent rows kept for exactly the accepted tokens, and speculation
with it token for token the plain greedy output."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from serving.configs.model import ModelConfig
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.model.presets import random_model
from serving.model.weights import WeightError, load_weights
from serving.speculation.drafters import parse_speculate
from serving.stack import ServingConfig, build_engine

PROMPTS = [[1, 2, 3, 4, 5], [9, 9], [7, 8, 9] * 6, list(range(20, 61)), [3]]


@pytest.fixture(scope="module")
def mtp_model():
    return random_model("tiny", seed=3, num_nextn_predict_layers=1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The demo trainer's tiny run: a target and its MTP module that have seen real text."""
    from serving.demo.train import run

    out = tmp_path_factory.mktemp("demo")
    run(out, tiny=True, steps=40, log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def random_folder(trained, tmp_path_factory):
    """The trained folder's layout with seeded random weights: decisive logits, so a module
    fed the wrong rows or tokens shows in its top tokens (a barely trained one hardly would)."""
    from safetensors.torch import save_file

    from serving.model.presets import random_weights

    folder = tmp_path_factory.mktemp("random-mtp")
    for name in ("config.json", "generation_config.json", "tokenizer.json", "heldout.json"):
        shutil.copy(trained / name, folder / name)
    cfg = ModelConfig.from_folder(folder)
    weights = {k: v.contiguous() for k, v in random_weights(cfg, seed=5).items()}
    mtp = f"model.layers.{cfg.mtp_layer}."
    save_file({k: v for k, v in weights.items() if not k.startswith(mtp)}, str(folder / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if k.startswith(mtp)}, str(folder / "mtp.safetensors"))
    return folder


def generate(model, spec, prompts=PROMPTS, max_new=24, slots=1024, **config):
    stack = build_engine(ServingConfig(backend="reference", speculate=spec, pool_slots=slots, **config), model)
    return stack.engine, stack.engine.generate(prompts, max_new)


@pytest.mark.parametrize("spec", ["mtp:1x1", "mtp:1x3", "mtp:2x3", "mtp:4x2", "mtp:8x1"])
def test_mtp_speculation_equals_plain_greedy(mtp_model, spec):
    _, plain = generate(mtp_model, None)
    eng, reqs = generate(mtp_model, spec)
    for p, s in zip(plain, reqs):
        assert p.error is None and s.error is None
        assert s.output == p.output and len(s.output) == 24
    assert eng.pool.leaked_slots() == 0
    assert eng.pool.allocator.num_free == eng.pool.allocator.capacity


def test_mtp_through_graph_buffers_equals_eager(mtp_model):
    """Static bucket buffers and re-planning (the CUDA-graph path without capture, the kernel
    under Triton's interpreter): the chain steps' state indices travel in the packed step."""
    prompts = PROMPTS[:3]

    def engine(static: bool):
        pool = mtp_model.new_pool(512, torch.bfloat16, max_requests=8, max_context=96)
        config = ServingConfig(backend="kernel", speculate="mtp:2x3", pool_slots=pool.num_slots, cuda_graphs=static,
                               graph_batch_sizes=(1, 2, 8), capture_graphs=False)
        return build_engine(config, mtp_model, pool).engine

    eager, static = engine(False), engine(True)
    want = eager.generate(prompts, 8)
    got = static.generate(prompts, 8)
    assert [r.output for r in got] == [r.output for r in want]
    graphs = static.runner.graphs
    assert graphs.replays > 0 and graphs.eager_steps == 0
    assert {k.family.name for k in graphs.graphs} == {"decode", "verify", "mtp-chain"}
    assert static.pool.leaked_slots() == 0


def test_the_pool_has_a_layer_for_the_module(mtp_model):
    pool = mtp_model.new_pool(64)
    assert pool.kv.shape[0] == mtp_model.num_layers + 1
    with pytest.raises(ValueError, match="layers"):
        build_engine(ServingConfig(backend="reference", speculate="mtp:1x2", pool_slots=64),
                     mtp_model, random_model("tiny", seed=3).new_pool(64))


def test_mtp_on_a_model_without_the_module_is_refused():
    with pytest.raises(ValueError, match="MTP module"):
        build_engine(ServingConfig(backend="reference", speculate="mtp:1x2", pool_slots=64), random_model("tiny", seed=3))


@pytest.mark.parametrize("spec", ["mtp:9x1", "mtp:0x2", "mtp:1x64", "mtp:2x2:n=3"])
def test_bad_mtp_specs_are_refused(spec):
    with pytest.raises(ValueError, match="Expected"):
        parse_speculate(spec)


def _reference(folder):
    """transformers' target and the trainer's MTP module (transformers' decoder block) with the
    folder's weights, in float32."""
    from safetensors.torch import load_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from serving.demo.train import MTPModule

    target = DeepseekV3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    cfg = DeepseekV3Config.from_pretrained(folder)
    cfg._attn_implementation = "sdpa"
    mtp = MTPModule(cfg).float().eval()
    n = cfg.num_hidden_layers
    p = f"model.layers.{n}."
    saved = {k[len(p):]: v.float() for k, v in load_file(str(folder / "mtp.safetensors")).items()}
    state = {"enorm.weight": saved.pop("enorm.weight"), "hnorm.weight": saved.pop("hnorm.weight"),
             "eh_proj.weight": saved.pop("eh_proj.weight"), "shared_head_norm.weight": saved.pop("shared_head.norm.weight")}
    head = saved.pop("shared_head.head.weight")
    saved.pop("embed_tokens.weight", None)  # the module's own embeddings: a test that writes them uses them itself
    state.update({"block." + k: v for k, v in saved.items()})
    mtp.load_state_dict(state)
    return target, mtp, head


def _reference_mtp_topk(target, mtp, head, tokens: list[int], k: int) -> list[int]:
    """The module's top-k after the last of ``tokens``: hidden state at position M-1 of the
    first M = len(tokens) - 1 tokens, fed the last token."""
    ids = torch.tensor([tokens[:-1]])
    with torch.no_grad():
        hidden = target.model(input_ids=ids).last_hidden_state
        embeds = target.model.embed_tokens(torch.tensor([tokens[1:]]))
        positions = torch.arange(ids.shape[1])[None]
        out = mtp(hidden, embeds, target.model.rotary_emb(embeds, positions))
        logits = out[0, -1] @ head.T
    return logits.topk(k).indices.tolist()


@pytest.mark.parametrize("chunk", [8192, 16])
def test_mtp_rows_and_outputs_match_transformers(random_folder, chunk):
    """After prefill (in one chunk or several) and every verify step, accepted and rejected
    drafts alike, the module's top tokens equal transformers' block run over the whole history:
    its latent rows in the pool are those of exactly the tokens kept."""
    target, mtp, head = _reference(random_folder)
    model = DeepseekV3Model.from_folder(random_folder)
    assert model.has_mtp
    prompts = [p["ids"][:40] for p in json.loads((random_folder / "heldout.json").read_text())["prompts"][:2]]
    eng = build_engine(ServingConfig(backend="reference", speculate="mtp:2x2", pool_slots=512, prefill_chunk=chunk), model).engine
    reqs = [eng.add_request(p, 20) for p in prompts]
    for r in reqs:
        eng.prefill(r)
    checked = 0
    while any(not r.finished for r in reqs):
        for r in reqs:
            if not r.finished:
                row = eng.pool.table.row(r.req_id)
                assert eng.runner.mtp.candidates[row] == _reference_mtp_topk(target, mtp, head, r.tokens, 2)
                checked += 1
        eng.step(reqs)
    assert checked >= 4


def test_trained_folder_is_deepseek_layout(trained):
    cfg = json.loads((trained / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 1
    assert (trained / "tokenizer.json").is_file() and (trained / "generation_config.json").is_file()
    from safetensors import safe_open

    with safe_open(str(trained / "mtp.safetensors"), "pt") as f:
        names = set(f.keys())
    n = cfg["num_hidden_layers"]
    for part in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "shared_head.head.weight",
                 "self_attn.kv_a_proj_with_mqa.weight", "mlp.down_proj.weight"):
        assert f"model.layers.{n}.{part}" in names
    assert f"model.layers.{n}.embed_tokens.weight" not in names  # shared with the target


def test_missing_or_misshaped_mtp_tensors_are_named(trained, tmp_path):
    from safetensors.torch import load_file, save_file

    cfg = ModelConfig.from_folder(trained)
    n = cfg.num_hidden_layers
    for case in ("missing", "shape"):
        folder = tmp_path / case
        shutil.copytree(trained, folder)
        tensors = load_file(str(folder / "mtp.safetensors"))
        if case == "missing":
            del tensors[f"model.layers.{n}.eh_proj.weight"]
        else:
            tensors[f"model.layers.{n}.eh_proj.weight"] = tensors[f"model.layers.{n}.eh_proj.weight"][:, :-1].contiguous()
        save_file(tensors, str(folder / "mtp.safetensors"))
        with pytest.raises(WeightError, match=rf"model\.layers\.{n}\.eh_proj\.weight"):
            load_weights(folder, cfg, torch.float32, torch.device("cpu"))


def test_own_mtp_embeddings_are_used(random_folder, tmp_path):
    """A checkpoint whose module carries its own embed_tokens (as DeepSeek-V3's does) drafts with
    them: the module's first level after prefill is transformers' block fed those embeddings."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "own"
    shutil.copytree(random_folder, folder)
    cfg = ModelConfig.from_folder(folder)
    n = cfg.num_hidden_layers
    tensors = load_file(str(folder / "mtp.safetensors"))
    own = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=torch.Generator().manual_seed(9))
    tensors[f"model.layers.{n}.embed_tokens.weight"] = own
    save_file(tensors, str(folder / "mtp.safetensors"))
    model = DeepseekV3Model.from_folder(folder)
    assert torch.equal(model.mtp_embed, own)
    target, mtp, head = _reference(folder)
    ids = torch.tensor([[5, 17, 99, 3, 42, 8]])
    eng = build_engine(ServingConfig(backend="reference", speculate="mtp:2x1", pool_slots=128), model).engine
    req = eng.add_request(ids[0].tolist(), 2)
    eng.prefill(req)
    with torch.no_grad():
        hidden = target.model(input_ids=ids).last_hidden_state
        nxt = torch.tensor([ids[0, 1:].tolist() + [req.output[0]]])
        embeds = torch.nn.functional.embedding(nxt, own)  # the module's own, not the target's
        out = mtp(hidden, embeds, target.model.rotary_emb(embeds, torch.arange(ids.shape[1])[None]))
    assert eng.runner.mtp.candidates[eng.pool.table.row(req.req_id)] == (out[0, -1] @ head.T).topk(2).indices.tolist()


def _reference_chain(target, mtp, head, tokens: list[int], first: int, more: int) -> list[int]:
    """The module's greedy chain after ``tokens`` (the last one not cached yet) whose first draft
    is ``first``: the history's rows teacher-forced (the target's state, the next token), then
    each drafted row fed the previous row's output state and its token, as SGLang's NextN."""
    with torch.no_grad():
        states = list(target.model(input_ids=torch.tensor([tokens[:-1]])).last_hidden_state[0])
        next_ids = list(tokens[1:])

        def last_state():
            embeds = target.model.embed_tokens(torch.tensor([next_ids]))
            positions = torch.arange(len(next_ids))[None]
            return mtp(torch.stack(states)[None], embeds, target.model.rotary_emb(embeds, positions))[0, -1]

        prev, token, chain = last_state(), first, []
        for _ in range(more):
            states.append(prev)
            next_ids.append(token)
            prev = last_state()
            token = int((prev @ head.T).argmax())
            chain.append(token)
    return chain


@pytest.mark.parametrize("spec,backend,prompt_len", [("mtp:1x4", "reference", 30), ("mtp:3x3", "reference", 30),
                                                     ("mtp:2x4", "kernel", 300)])
def test_mtp_chains_match_transformers(random_folder, spec, backend, prompt_len, monkeypatch):
    """Each drafted chain is the module's own greedy chain, as transformers' block computes it
    when fed its output state and tokens level by level (the one-step chain's passes)."""
    from serving.speculation.drafters import DraftContext

    target, mtp, head = _reference(random_folder)
    model = DeepseekV3Model.from_folder(random_folder)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    heldout = json.loads((random_folder / "heldout.json").read_text())["prompts"]
    prompt = [t for p in heldout for t in p["ids"]][:prompt_len]
    eng = build_engine(ServingConfig(backend=backend, speculate=spec, pool_slots=1024,
                                     pool_dtype=torch.bfloat16 if backend == "kernel" else torch.float32), model).engine
    req = eng.add_request(prompt, 8)
    eng.prefill(req)
    eng.step([req])  # one verify step: the state comes from the target's step, not the prefill
    tree = eng.drafter.propose(DraftContext(eng.runner), [req])[0].read()
    width, depth = eng.drafter.width, eng.drafter.depth
    firsts = _reference_mtp_topk(target, mtp, head, req.tokens, width)
    want = [[t] + _reference_chain(target, mtp, head, req.tokens, t, depth - 1) for t in firsts]
    from serving.speculation.tree import DraftTree

    expected = DraftTree.from_paths(want)
    assert tree.tokens == expected.tokens and tree.parents == expected.parents
    assert eng.pool.leaked_slots() == 0 or not req.finished


def test_a_drafter_without_fused_topk_still_serves():
    """A drafter written to the protocol before ``fused_topk`` (the decode-speed gate's fixed
    trees) rides on no target step, eagerly and through the graph buffers."""
    from phases.cudagraph.decode_speed import FixedTreeDrafter

    model = random_model("tiny", seed=3)
    for graphs in (False, True):
        drafter = FixedTreeDrafter(2, 2, model.cfg.vocab_size)
        del drafter.fused_topk
        config = ServingConfig(backend="kernel" if graphs else "reference", speculate=drafter, pool_slots=256,
                               cuda_graphs=graphs, capture_graphs=False, graph_batch_sizes=(1, 2))
        eng = build_engine(config, model).engine
        reqs = eng.generate(PROMPTS[:2], 6)
        assert all(r.error is None and len(r.output) == 6 for r in reqs)
