"""The documentation holds together: every relative link in README.md and docs/ points to a
file that exists (and, with ``#anchor``, to a heading of that file), every page under docs/
can be reached from the README, and no page speaks of tracker numbers instead of the
software."""
from __future__ import annotations

import os
import re
from typing import Dict, List, Set, Tuple

import pytest

from conftest import ROOT

DOCS = os.path.join(ROOT, "docs")
PAGES = sorted([os.path.join(ROOT, "README.md")] +
               [os.path.join(d, f) for d, _, fs in os.walk(DOCS) for f in fs if f.endswith(".md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text without fenced code blocks (their '#' lines are not headings, their brackets not links)."""
    return _FENCE.sub("", text)


def slug(heading: str, seen: Dict[str, int]) -> str:
    """The anchor GitHub gives a heading: inline markup dropped, lower case, punctuation removed,
    spaces to hyphens; a repeated slug gets -1, -2, ..."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[`*]", "", text)  # code and emphasis marks
    s = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
    n = seen.get(s, 0)
    seen[s] = n + 1
    return s if n == 0 else f"{s}-{n}"


def anchors(path: str) -> Set[str]:
    with open(path, encoding="utf-8") as f:
        text = prose(f.read())
    seen: Dict[str, int] = {}
    return {slug(m.group(2), seen) for m in _HEADING.finditer(text)}


def links(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        text = _CODE.sub("", prose(f.read()))
    return [m.group(1) for m in _LINK.finditer(text)]


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)  # http:, https:, mailto: ...


def resolve(page: str, target: str) -> Tuple[str, str]:
    """(file or directory the link names, anchor or '')."""
    path, _, anchor = target.partition("#")
    dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    return dest, anchor


def test_slug_follows_github():
    seen: Dict[str, int] = {}
    assert slug("Context parallelism: a CP rank's share of each sample", seen) == \
        "context-parallelism-a-cp-ranks-share-of-each-sample"
    assert slug("`DataLoader` and `StatefulDataLoader`", seen) == "dataloader-and-statefuldataloader"
    assert slug("zstd-compressed data is slow (`PerformanceWarning`)", seen) == \
        "zstd-compressed-data-is-slow-performancewarning"
    assert slug("Memlock limits (`ulimit -l`)", seen) == "memlock-limits-ulimit--l"
    assert slug("1. Install", seen) == "1-install"
    assert slug("1. Install", seen) == "1-install-1"
    assert slug("The `cache_dir` option", {}) == "the-cache_dir-option"


@pytest.mark.parametrize("page", PAGES, ids=[os.path.relpath(p, ROOT) for p in PAGES])
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if not relative(target):
            continue
        dest, anchor = resolve(page, target)
        if not os.path.exists(dest):
            broken.append(f"{target}: no such file ({os.path.relpath(dest, ROOT)})")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {os.path.relpath(dest, ROOT)}")
    assert not broken, f"{os.path.relpath(page, ROOT)}: " + "; ".join(broken)


def test_every_page_is_reachable_from_the_readme():
    seen: Set[str] = set()
    todo = [os.path.join(ROOT, "README.md")]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for target in links(page):
            if relative(target):
                dest, _ = resolve(page, target)
                if dest.endswith(".md") and os.path.isfile(dest):
                    todo.append(dest)
    orphans = [os.path.relpath(p, ROOT) for p in PAGES if p not in seen]
    assert not orphans, f"pages no link from README.md leads to: {orphans}"


def test_no_tracker_references():
    pattern = re.compile(r"\b(?:issue|PR|pull request|ticket)\s*#\s*\d+|\bGH-\d+\b", re.I)
    found = []
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if pattern.search(line):
                    found.append(f"{os.path.relpath(page, ROOT)}:{i}: {line.strip()}")
    assert not found, "say what the software does, not which ticket asked for it:\n" + "\n".join(found)


def test_pages_named_in_code_exist():
    """A page of the docs named in the code (a docstring, a comment, an error message: "see
    docs/balance.md") exists, with the heading it names: a user sent there finds it."""
    missing = []
    pat = re.compile(r"docs/([\w./-]+?\.md)(#[\w-]+)?")
    for top in ("python", "csrc", "benchmarks", "tests", ".ci"):
        for d, _, fs in os.walk(os.path.join(ROOT, top)):
            for f in fs:
                if not f.endswith((".py", ".pyi", ".c", ".h", ".sh")):
                    continue
                path = os.path.join(d, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for m in pat.finditer(text):
                    page = os.path.join(DOCS, m.group(1))
                    where = f"{os.path.relpath(path, ROOT)}: docs/{m.group(1)}{m.group(2) or ''}"
                    if not os.path.exists(page):
                        missing.append(where + " (no such page)")
                    elif m.group(2) and m.group(2)[1:] not in anchors(page):
                        missing.append(where + " (no such heading)")
    assert not missing, "; ".join(sorted(set(missing)))
