"""Generation stops at the model's end-of-sequence ids exactly as transformers' ``generate`` does.

The eos id is chosen from a greedy continuation so that it is emitted mid-way; the three places
transformers reads it from are each compared with transformers itself: ``generation_config.json``
(an int or a list), ``config.json`` when there is no ``generation_config.json``, and none when
``generation_config.json`` has no ``eos_token_id`` (config.json's is then not used).
"""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("transformers", reason="transformers is the oracle of these tests (pip install -e .[test])")

from serving.configs.model import eos_token_ids
from serving.model.deepseek_v3 import DeepseekV3Model
from serving.stack import ServingConfig, build_engine
from serving.stack.cli import main
from tests.backend.hf_models import hf_generate, hf_greedy, load_hf, save_tiny

PROMPT = [5, 17, 99, 3, 42, 8, 8, 1]
MAX_NEW = 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(folder, greedy continuation without eos, an id greedy first emits at index >= 3)."""
    folder = save_tiny(tmp_path_factory.mktemp("tiny"))
    full = hf_greedy(load_hf(folder), PROMPT, MAX_NEW)
    k = next(k for k in range(3, MAX_NEW - 2) if full[k] not in full[:k])
    return folder, full, full[k]


def with_eos(tiny, tmp_path, config_eos, generation):
    """A copy of the tiny folder with config.json's eos_token_id set and generation_config.json
    replaced by ``generation`` (None: no such file)."""
    folder, _, _ = tiny
    out = tmp_path / "model"
    shutil.copytree(folder, out)
    raw = json.loads((out / "config.json").read_text())
    raw["eos_token_id"] = config_eos
    (out / "config.json").write_text(json.dumps(raw))
    (out / "generation_config.json").unlink()
    if generation is not None:
        (out / "generation_config.json").write_text(json.dumps(generation))
    return out


LAYOUTS = {
    "generation_config int": lambda eos: (None, {"eos_token_id": eos}),
    "generation_config list": lambda eos: (7, {"eos_token_id": [127, eos]}),
    "config.json only": lambda eos: (eos, None),
    "generation_config without eos": lambda eos: (eos, {"bos_token_id": 0}),
}


def engine_for(folder, eos, speculate=None):
    model = DeepseekV3Model.from_folder(folder)
    pool = model.new_pool(256)
    config = ServingConfig(backend="reference", speculate=speculate, pool_slots=pool.num_slots,
                           eos_token_ids=tuple([eos] if isinstance(eos, int) else eos or ()))
    return build_engine(config, model, pool).engine


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_engine_stops_where_transformers_generate_stops(tiny, tmp_path, layout):
    _, full, eos = tiny
    folder = with_eos(tiny, tmp_path, *LAYOUTS[layout](eos))
    want = hf_generate(load_hf(folder), PROMPT, MAX_NEW)
    ids = eos_token_ids(folder, 128)
    for speculate in (None, "tree:3x3", "ngram:2x2"):
        req = engine_for(folder, ids, speculate).generate([PROMPT], MAX_NEW)[0]
        assert req.error is None and req.output == want, f"{layout}, speculate={speculate}"
    if layout == "generation_config without eos":
        assert ids == () and want == full
    else:
        assert want[-1] == eos and len(want) < MAX_NEW and want == full[: len(want)]


def test_engine_accepts_an_int_a_list_or_none(tiny):
    folder, full, eos = tiny
    stop = full.index(eos) + 1
    assert engine_for(folder, eos).generate([PROMPT], MAX_NEW)[0].output == full[:stop]
    assert engine_for(folder, [126, eos]).generate([PROMPT], MAX_NEW)[0].output == full[:stop]
    assert engine_for(folder, None).generate([PROMPT], MAX_NEW)[0].output == full


def run(capsys, *args):
    code = main(["generate", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_stops_at_the_folders_eos_like_transformers(tiny, tmp_path, capsys):
    _, full, eos = tiny
    folder = with_eos(tiny, tmp_path, *LAYOUTS["generation_config list"](eos))
    want = hf_generate(load_hf(folder), PROMPT, MAX_NEW)
    code, out, err = run(capsys, "--model", folder, "--prompt", ",".join(map(str, PROMPT)), "--max-new-tokens", MAX_NEW, "--json")
    result = json.loads(out)
    assert code == 0, err
    assert result["eos_token_ids"] == [127, eos]
    assert result["requests"][0]["output"] == want and result["requests"][0]["finish_reason"] == "eos"
    code, out, err = run(capsys, "--model", folder, "--prompt", ",".join(map(str, PROMPT)), "--max-new-tokens", MAX_NEW,
                         "--json", "--ignore-eos")
    assert code == 0 and json.loads(out)["requests"][0]["output"] == full
    assert json.loads(out)["requests"][0]["finish_reason"] == "length"


def test_cli_eos_token_id_option_on_a_random_preset(capsys):
    code, out, _ = run(capsys, "--random-model", "tiny", "--prompt", "5", "--max-new-tokens", 12, "--json")
    full = json.loads(out)["requests"][0]["output"]
    eos = next(t for k, t in enumerate(full[2:], 2) if t not in full[:k])
    code, out, _ = run(capsys, "--random-model", "tiny", "--prompt", "5", "--max-new-tokens", 12, "--json", "--eos-token-id", eos)
    assert code == 0 and json.loads(out)["requests"][0]["output"] == full[: full.index(eos) + 1]
