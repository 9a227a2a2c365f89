"""Tree fingerprint: stable across copies, sensitive to tracked content, and the same file set
as ``git ls-files --cached --others --exclude-standard``."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from runner.errors import UsageError
from runner.repo.fingerprint import fingerprint_files, tree_fingerprint

GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, env={**os.environ, **GIT_ENV}, check=True,
        capture_output=True, text=True,
    ).stdout


def git_files(root: Path) -> list[str]:
    out = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return sorted((name for name in out.split("\0") if name), key=os.fsencode)


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


TREE = {
    ".gitignore": "*.log\n!keep.log\n/build/\n__pycache__/\n/reports/\n",
    "src/a.py": "print('a')\n",
    "src/b.py": "print('b')\n",
    "src/__pycache__/a.cpython-311.pyc": "junk",
    "keep.log": "kept\n",
    "debug.log": "ignored\n",
    "build/out.o": "binary",
    "docs/readme.md": "# docs\n",
    "docs/.gitignore": "draft*\n!draft-final.md\n",
    "docs/draft-1.md": "draft\n",
    "docs/draft-final.md": "final\n",
    "plans/plan.md": "status: pending\n",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    write(root, TREE)
    return root


def test_file_set_and_format(tree):
    assert fingerprint_files(tree) == [
        ".gitignore", "docs/.gitignore", "docs/draft-final.md", "docs/readme.md", "keep.log",
        "plans/plan.md", "src/a.py", "src/b.py",
    ]
    fp = tree_fingerprint(tree)
    assert fp.startswith("sha256:") and len(fp) == len("sha256:") + 64


def test_hash_definition(tmp_path):
    write(tmp_path, {"b.txt": "B", "a/x": "X"})
    expected = hashlib.sha256()
    for rel, content in [("a/x", b"X"), ("b.txt", b"B")]:
        expected.update(rel.encode() + b"\0" + hashlib.sha256(content).digest() + b"\0")
    assert tree_fingerprint(tmp_path) == "sha256:" + expected.hexdigest()


def test_copy_with_and_without_git_agree(tree, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "init")
    assert (tree / ".git").is_dir() and not (copy / ".git").exists()
    assert tree_fingerprint(tree) == tree_fingerprint(copy)


@pytest.mark.parametrize(
    "change",
    [
        lambda r: (r / "src/a.py").write_text("print('A')\n"),
        lambda r: (r / "src/new.py").write_text(""),
        lambda r: (r / "src/b.py").rename(r / "src/c.py"),
        lambda r: (r / "src/b.py").unlink(),
        lambda r: (r / "docs/draft-final.md").write_text("changed"),
        lambda r: (r / "empty").write_text(""),
    ],
    ids=["modify", "add", "rename", "delete", "negated-file", "empty-file"],
)
def test_tracked_changes_change_the_fingerprint(tree, change):
    before = tree_fingerprint(tree)
    change(tree)
    assert tree_fingerprint(tree) != before


@pytest.mark.parametrize(
    "change",
    [
        lambda r: (r / "debug.log").write_text("more"),
        lambda r: (r / "build/other.o").write_text("x"),
        lambda r: (r / "src/__pycache__/b.pyc").write_text("x"),
        lambda r: (r / "docs/draft-2.md").write_text("x"),
        lambda r: write(r, {"reports/p1/results.json": "{}"}),
        lambda r: (r / "plans/plan.md").write_text("status: complete\n"),
        lambda r: write(r, {".git/HEAD": "ref: refs/heads/main\n"}),
    ],
    ids=["ignored-log", "ignored-dir", "nested-pycache", "nested-ignore", "reports",
         "excluded-plan", "dot-git"],
)
def test_ignored_and_excluded_changes_keep_the_fingerprint(tree, change):
    exclude = ["plans/plan.md", "reports/"]
    before = tree_fingerprint(tree, exclude)
    change(tree)
    assert tree_fingerprint(tree, exclude) == before


def test_exclude_forms(tree):
    base = fingerprint_files(tree, ["docs/"])
    assert not any(name.startswith("docs/") for name in base)
    assert fingerprint_files(tree, ["docs"]) == base
    assert fingerprint_files(tree, [str(tree / "docs")]) == base
    assert fingerprint_files(tree, ["/elsewhere/outside"]) == fingerprint_files(tree)
    with pytest.raises(UsageError):
        fingerprint_files(tree, ["."])


def test_symlink_is_hashed_by_target_not_followed(tmp_path):
    write(tmp_path, {"real/file.txt": "content", "other.txt": "x"})
    os.symlink("real", tmp_path / "dirlink")
    os.symlink("other.txt", tmp_path / "filelink")
    assert fingerprint_files(tmp_path) == ["dirlink", "filelink", "other.txt", "real/file.txt"]
    before = tree_fingerprint(tmp_path)
    (tmp_path / "other.txt").write_text("changed target content")
    after_content = tree_fingerprint(tmp_path)
    (tmp_path / "filelink").unlink()
    os.symlink("real/file.txt", tmp_path / "filelink")
    assert len({before, after_content, tree_fingerprint(tmp_path)}) == 3


def test_dangling_symlink_is_fine(tmp_path):
    os.symlink("nowhere", tmp_path / "dangling")
    assert fingerprint_files(tmp_path) == ["dangling"]
    tree_fingerprint(tmp_path)


def test_not_a_directory(tmp_path):
    with pytest.raises(UsageError, match="not a directory"):
        tree_fingerprint(tmp_path / "missing")


# --- agreement with git -------------------------------------------------------------------------

GIT_CASE_FILES = [
    "a.log", "keep.log", "x.tmp", "build/out", "src/build/out", "src/main.py", "src/util.py",
    "src/gen/code.c", "gen", "docs/a.md", "docs/index.md", "docs/sub/deep.md", "a/keep",
    "a/other", "a/b/c", "nest/a.py", "nest/b.txt", "nest/d/c.py", "nest/d/e.txt",
    "sub/y.log", "sub/local", "sub/q/local", "sub/anchored", "sub/q/anchored", "sp ace/f g",
    "data[1].csv", "data2.csv", "#hash", "!bang", "trail ", "foo/bar/baz.txt", "foo/baz.txt",
    "deep/x/y/z.bin", "deep/z.bin", "Upper.TXT",
]
GIT_CASE_IGNORES = {
    ".gitignore": (
        "# comment\n*.log\n!keep.log\n/build/\na/**\n!a/keep\ndocs/*\n!docs/index.md\n"
        "**/gen/\ndata[0-9].csv\n\\#hash\n\\!bang\ntrail\\ \nfoo/**/baz.txt\ndeep/**/*.bin\n"
        "*.[Tt][Xx][Tt]\n  \n"
    ),
    "sub/.gitignore": "!*.log\nlocal\n/anchored\n",
    "nest/.gitignore": "*\n!*/\n!*.py\n!.gitignore\n",
}


def test_file_set_equals_git_ls_files(tmp_path):
    write(tmp_path, {name: name for name in GIT_CASE_FILES} | GIT_CASE_IGNORES)
    os.symlink("src", tmp_path / "srclink")
    git(tmp_path, "init", "-q")
    (tmp_path / ".git/info/exclude").unlink(missing_ok=True)
    git(tmp_path, "add", "src/main.py", ".gitignore")
    git(tmp_path, "commit", "-q", "-m", "some tracked files")
    ours, theirs = fingerprint_files(tmp_path), git_files(tmp_path)
    assert ours == theirs
    assert "a/keep" in ours and "nest/d/c.py" in ours and "docs/sub/deep.md" not in ours


PATTERN_VOCAB = [
    "*.py", "!*.py", "*.txt", "!keep*", "build/", "/build", "build", "!build/", "**/cache",
    "cache/", "src/*", "!src/*.py", "src/**", "!src/**/", "*", "!*/", "?.md", "[ab]*",
    "[!a-c]*.md", "docs/**/*.md", "!docs/", "/top.txt", "d*/", "**/x/**", "!**/x/keep",
    "lib/**/y", "*.bak", "!important.bak",
]
PATTERN_FILES = [
    "a.py", "b.txt", "keep.txt", "top.txt", "src/top.txt", "build/o", "src/build/o",
    "src/m.py", "src/deep/n.py", "src/deep/cache/c", "cache/c", "docs/a.md", "docs/r/b.md",
    "c.md", "x.md", "data/x/keep", "data/x/drop", "lib/y", "lib/q/y", "lib/q/z",
    "old.bak", "important.bak", "dx/f", "d/f",
]


@pytest.mark.parametrize("seed", range(20))
def test_random_ignore_rules_match_git(tmp_path, seed):
    rng = random.Random(seed)
    files = {name: name for name in PATTERN_FILES}
    files[".gitignore"] = "\n".join(rng.sample(PATTERN_VOCAB, rng.randint(2, 7))) + "\n"
    for folder in ("src", "docs", "data/x"):
        if rng.random() < 0.5:
            files[f"{folder}/.gitignore"] = "\n".join(rng.sample(PATTERN_VOCAB, rng.randint(1, 4))) + "\n"
    write(tmp_path, files)
    git(tmp_path, "init", "-q")
    (tmp_path / ".git/info/exclude").unlink(missing_ok=True)
    assert fingerprint_files(tmp_path) == git_files(tmp_path), files
