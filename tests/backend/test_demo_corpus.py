"""The demo corpus: files that are data more than code are dropped, and so are copies."""

import pytest

from serving.demo import corpus

CODE = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n"


@pytest.mark.parametrize("text, reason", [
    (CODE, None),
    (CODE + "s = '" + "ab" * 600 + "'\n", "a line over"),
    (("v = " + "1, " * 40 + "\n") * 20, "mean line over"),
    (CODE + "#" * 90 + "\n" + "-" * 90 + "\n" + "=" * 90 + "\n", "alphanumeric"),
    (CODE + 'pretty = """⎛ 2⎞\n⎝x ⎠"""\n', "outside ASCII"),
    ("\n \n", "empty"),
])
def test_quality_names_why_a_file_is_data(text, reason):
    got = corpus.quality(text)
    assert got == reason if reason is None else reason in got


def test_split_drops_copies_and_data_files_in_train_and_held_out(tmp_path, monkeypatch):
    root = tmp_path / "lib"
    files = {f"pkg{i}/mod.py": CODE.replace("add", f"add{i}") for i in range(400)}
    files.update({f"vendored{i}/mod.py": CODE.replace("add", f"add{i}") for i in range(400)})  # copies
    files.update({f"glyphs{i}.py": 'x = """' + "⎝" * 50 + '"""\n' for i in range(400)})
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.setattr(corpus, "roots", lambda: [root])
    train, held = corpus.split(max_bytes=10**9)
    kept = train + held
    assert held, "the test needs held-out files"
    assert not any(f.relative.startswith("glyphs") for f in kept)
    texts = [f.text() for f in kept]
    assert len(texts) == len(set(texts)) == 400  # one of each pair of copies
    assert not {f.relative for f in train} & {f.relative for f in held}
