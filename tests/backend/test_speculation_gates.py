"""The speculation phase's gates on the CPU profile: they train the tiny demo model, measure
every mode, and the greedy check catches speculation that changes tokens."""

from __future__ import annotations

import pytest

import serving.engine.model_runner as model_runner
from phases.speculation import greedy_trained, speculation
from tests.sampled_gates import assert_samples


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory):
    from serving.demo.train import run

    folder = tmp_path_factory.mktemp("demo")
    run(folder, tiny=True, steps=20, log=lambda *_: None)
    return folder


@pytest.fixture(autouse=True)
def _own_model(demo_folder, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("MLA_GATE_DEMO_MODEL", str(demo_folder))


def test_benchmark_reports_every_mode_and_the_headline_as_samples():
    m = speculation.run(tiny=True, contexts=[40], batch_sizes=[1, 2], max_new_tokens=4, samples=6, device="cpu")
    for mode in speculation.MODES:
        assert m[f"{mode}_40_b1_tok_s"] > 0
        assert m[f"{mode}_40_b2_tokens_per_step"] >= 1
    for mode in ("mtp_chain", "mtp_tree"):  # both MTP modes are sampled sides at batch 1
        assert m[f"{mode}_ratio_b1"] == m[f"{mode}_40_b1_ratio"]
        assert_samples(m, f"{mode}_ratio_b1", 6)
        per_step = assert_samples(m, f"{mode}_tokens_per_step_b1", 6)
        assert all(1 <= p <= 1 + 12 for p in per_step)
    assert assert_samples(m, "plain_40_b1_tokens_per_step", 6) == [1.0] * 6
    assert isinstance(m["ngram_40_b1_ratio"], float) and isinstance(m["mtp_tree_40_b2_ratio"], float)
    best = m["mtp_best_mode"]
    assert best in ("mtp_chain", "mtp_tree")
    assert m["mtp_best_ratio_b1"] == m[f"{best}_ratio_b1"]
    assert m["mtp_best_tokens_per_step_b1"] == m[f"{best}_tokens_per_step_b1"]


def test_benchmark_judges_the_mtp_mode_whose_median_ratio_is_higher(monkeypatch):
    """A planted chain twice as fast as plain and a tree at plain's speed: the chain is the best
    mode, whatever order the modes were measured in."""
    speeds = {"plain": 100.0, "mtp_chain": 200.0, "mtp_tree": 100.0}

    def fake(engine, prompts, max_new_tokens, what):
        mode = what.split(" at ")[0]
        return speeds[mode], 3.0 if mode != "plain" else 1.0

    monkeypatch.setattr(speculation, "measure", fake)
    m = speculation.run(tiny=True, contexts=[40], batch_sizes=[1], max_new_tokens=2, samples=6, device="cpu",
                        modes={"plain": None, "mtp_tree": "mtp:2x2", "mtp_chain": "mtp:1x2"})
    assert m["mtp_best_mode"] == "mtp_chain" and m["mtp_best_ratio_b1"] == [2.0] * 6
    speeds.update(mtp_chain=100.0, mtp_tree=250.0)
    m = speculation.run(tiny=True, contexts=[40], batch_sizes=[1], max_new_tokens=2, samples=6, device="cpu",
                        modes={"plain": None, "mtp_tree": "mtp:2x2", "mtp_chain": "mtp:1x2"})
    assert m["mtp_best_mode"] == "mtp_tree" and m["mtp_best_ratio_b1"] == [2.5] * 6


def test_benchmark_rounds_alternate_the_two_engines_and_use_one_prompt_each(monkeypatch):
    calls = []
    original = speculation.measure

    def recording(engine, prompts, max_new_tokens, what):
        calls.append((what, prompts))
        return original(engine, prompts, max_new_tokens, what)

    monkeypatch.setattr(speculation, "measure", recording)
    m = speculation.run(tiny=True, contexts=[40], batch_sizes=[1], max_new_tokens=2, samples=3, device="cpu",
                      modes={"plain": None, "mtp_tree": "mtp:2x2"})
    rounds = [(what, prompts) for what, prompts in calls if "round" in what]
    assert [what for what, _ in rounds] == ["plain at 40 x 1, round 0", "mtp_tree at 40 x 1, round 0",
                                            "mtp_tree at 40 x 1, round 1", "plain at 40 x 1, round 1",
                                            "plain at 40 x 1, round 2", "mtp_tree at 40 x 1, round 2"]
    assert all(rounds[i][1] == rounds[i + 1][1] for i in range(0, 6, 2))  # both engines, one prompt a round
    assert len({tuple(p[0]) for _, p in rounds}) == 3  # a held-out prompt of its own per round
    assert len(m["mtp_tree_ratio_b1"]) == 3 and len(calls) == 6


def test_greedy_trained_passes_and_catches_a_wrong_acceptance(monkeypatch):
    m = greedy_trained.run(tiny=True, prompts=2, context=32, max_new_tokens=8, device="cpu")
    assert m["mismatched_tokens_fp32"] == 0 and m["leaked_slots"] == 0 and m["requests"] == 4
    original = model_runner.greedy_accept

    def accept_one_more(pred, fields, width):  # a planted bug: one draft too many kept
        out = original(pred, fields, width)
        out["n_accepted"] = (out["n_accepted"] + 1).clamp_max(width - 1)
        return out

    monkeypatch.setattr(model_runner, "greedy_accept", accept_one_more)
    bad = greedy_trained.run(tiny=True, prompts=2, context=32, max_new_tokens=8, device="cpu")
    assert bad["mismatched_tokens_fp32"] + bad["near_tie_divergences_fp32"] > 0


def test_accept_all_mtp_accepts_every_draft_and_keeps_the_tokens():
    """The best-case drafter: the real MTP drafter's work, its first chain replaced by plain
    greedy's continuation, so each step keeps all of it (but at the end of the request)."""
    from phases.speculation.bench.accept_all import AcceptAllMTP
    from serving.model.presets import random_model
    from serving.stack import ServingConfig, build_engine

    model = random_model("tiny", seed=3, num_nextn_predict_layers=1)
    base = ServingConfig(backend="reference", pool_slots=512)
    plain = build_engine(base, model).engine
    want = plain.add_request([1, 2, 3, 4, 5], 25)
    plain.run([want])
    drafter = AcceptAllMTP(2, 3, {})
    engine = build_engine(base.but(speculate=drafter), model).engine
    got = engine.add_request([1, 2, 3, 4, 5], 25)
    drafter.futures[got.req_id] = want.output
    engine.run([got])
    assert got.output == want.output
    assert engine.stats.steps == 6  # 1 token from prefill, then 4 per step (3 drafts + the bonus)
    assert engine.pool.leaked_slots() == 0


def test_accept_all_measure_keeps_the_set_acceptance_and_plain_tokens():
    """The random-preset measurement: every acceptance run emits plain decoding's tokens, at
    the acceptance it was set to (all drafts: depth + 1 per step; 1.5: 2.5 on average)."""
    from phases.speculation.bench.accept_all import measure

    m = measure("tiny", contexts=[64], width=2, depth=3, accepted=[None, 1.5, 0], max_new_tokens=40, device="cpu")
    assert m["leaked_slots"] == 0
    for a in ("all", "1.5", "0"):
        assert m[f"mtp_{a}_mismatched_tokens_64"] == 0
        assert m[f"mtp_{a}_tok_s_64"] > 0
    assert m["mtp_all_tokens_per_step_64"] > 3.5  # 4 a step but for the cut last one
    assert 2.2 <= m["mtp_1.5_tokens_per_step_64"] <= 2.8
    assert m["mtp_0_tokens_per_step_64"] == 1.0


def test_benchmark_reports_sampled_rows_beside_greedy_and_keeps_the_headline_greedy(monkeypatch):
    """Sampled rows (temperature 0.7, top-p 0.95) of plain, n-gram and both MTP modes, generated
    for real (greedy rows faked to keep the profile short): reported, with ratios over sampled
    plain; the headline stays the greedy one."""
    speeds = {"plain": 100.0, "ngram": 150.0, "mtp_chain": 200.0, "mtp_tree": 300.0}
    monkeypatch.setattr(speculation, "measure", lambda engine, prompts, new, what: (speeds[what.split(" at ")[0]], 2.0))
    modes = {"plain": None, "ngram": "ngram:2x2", "mtp_chain": "mtp:1x2", "mtp_tree": "mtp:2x2"}
    m = speculation.run(tiny=True, contexts=[40], batch_sizes=[1], max_new_tokens=3, samples=6, device="cpu", modes=modes,
                        sampled_modes=speculation.SAMPLED_ROW_MODES)
    for mode in modes:
        assert m[f"sampled_{mode}_40_b1_tok_s"] > 0 and 1 <= m[f"sampled_{mode}_40_b1_tokens_per_step"] <= 3
        if mode != "plain":
            assert m[f"sampled_{mode}_40_b1_ratio"] == m[f"sampled_{mode}_40_b1_tok_s"] / m["sampled_plain_40_b1_tok_s"]
    assert "sampled_plain_40_b1_ratio" not in m
    assert m["mtp_best_mode"] == "mtp_tree" and m["mtp_best_ratio_b1"] == [3.0] * 6  # greedy, as before
    assert speculation.SAMPLED.temperature == 0.7 and speculation.SAMPLED.top_p == 0.95
