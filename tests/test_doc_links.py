"""The README is a front door: short, and every document in docs/ is reachable from it by links;
every relative link of README.md and docs/*.md leads to a file that exists (and to a heading
there, when it names one), and every repository path they write in backticks exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_architecture import missing

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250

_FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.DOTALL | re.MULTILINE)
_CODE_SPAN = re.compile(r"`[^`\n]+`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return _FENCE.sub("", text)


def links(text: str) -> list[str]:
    """The link targets of ``text``'s prose (code blocks and code spans hold no links)."""
    return _LINK.findall(_CODE_SPAN.sub("code", prose(text)))


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives ``text``'s headings: lower case, code marks and punctuation
    dropped, spaces as ``-``, a repeated anchor numbered ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(prose(text)):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def broken_links(doc: Path) -> list[str]:
    """Each relative link of ``doc`` that leads nowhere, with why."""
    found = []
    for target in links(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            found.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            found.append(f"{target}: no heading #{anchor} there")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.relative_to(ROOT).as_posix())
def test_relative_links_lead_somewhere(doc):
    assert broken_links(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.relative_to(ROOT).as_posix())
def test_named_paths_exist(doc):
    assert missing(prose(doc.read_text(encoding="utf-8"))) == []


QUICK_START = """\
```console
make advance   # run the next phase of the shipped plan through the runner
make test      # run the test suite
```
"""


def test_the_readme_is_a_front_door():
    text = README.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/ and link it"
    assert QUICK_START in text
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^advance:", makefile, re.MULTILINE) and re.search(r"^test:", makefile, re.MULTILINE)


def test_every_document_is_reachable_from_the_readme():
    reached, todo = {README}, [README]
    while todo:
        doc = todo.pop()
        for target in links(doc.read_text(encoding="utf-8")):
            path = target.partition("#")[0]
            file = (doc.parent / path).resolve() if path and ":" not in path else None
            if file is not None and file.suffix == ".md" and file.is_file() and file not in reached:
                reached.add(file)
                todo.append(file)
    assert [doc.relative_to(ROOT).as_posix() for doc in DOCS if doc not in reached] == []


def test_link_checks_catch_what_they_should(tmp_path):
    (tmp_path / "b.md").write_text("# The `runner` on a toy plan\n\n## Exit codes\n\n## Exit codes\n")
    doc = tmp_path / "a.md"
    doc.write_text("[ok](b.md#the-runner-on-a-toy-plan) [ok](b.md#exit-codes-1) [web](https://example.org/x)\n"
                   "[gone](c.md) [bad anchor](b.md#nope) `[not a link](c.md)`\n\n```\n[not a link](d.md)\n```\n")
    assert broken_links(doc) == ["c.md: no such file", "b.md#nope: no heading #nope there"]
