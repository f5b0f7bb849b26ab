"""Every Python code block in README.md and docs/ runs as written, or says why it cannot.

The convention, visible to readers where the block is shown:

* a block whose first line is ``# fragment: <what it needs>`` is a fragment: it needs
  something a test cannot give (a GPU, a model, a cluster, a bucket, a checkpoint) or
  continues a block that does. It is compiled (a fragment is still valid Python), not run;
* a block that starts with ``>>>`` is an interactive session shown with its output: not run;
* every other ``python`` block runs. The blocks of one page run in order in one process
  (a later block may use what an earlier one made), with the current directory set to a
  scratch directory that holds the data the docs name: ``data/train``, ``data/web``,
  ``data/code``, ``data/books`` (small tokenfeed datasets, GPT-2 vocabulary) and
  ``corpus.jsonl`` (a few hundred lines of text). CPU only; each page within a bounded time.

Shell, text and C blocks are not run here: the commands they show are covered by the CLI
tests.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Dict, List, Tuple

import numpy as np
import pytest

import tokenfeed
from conftest import ROOT

DOCS = os.path.join(ROOT, "docs")
PAGES = sorted([os.path.join(ROOT, "README.md")] +
               [os.path.join(d, f) for d, _, fs in os.walk(DOCS) for f in fs if f.endswith(".md")])
_BLOCK = re.compile(r"^```(?:python|py)[^\S\n]*\n(.*?)^```[^\S\n]*$", re.S | re.M)
FRAGMENT = "# fragment"


def blocks(page: str) -> List[Tuple[int, str]]:
    """(line number, code) of each Python block of a page."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    return [(text[:m.start()].count("\n") + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def kind(code: str) -> str:
    first = code.lstrip("\n").split("\n", 1)[0].strip()
    if first.startswith(">>>"):
        return "session"
    return "fragment" if first.startswith(FRAGMENT) else "run"


ALL = [(p, line, code) for p in PAGES for line, code in blocks(p)]
RUNNABLE: Dict[str, List[Tuple[int, str]]] = {}
for _p, _line, _code in ALL:
    if kind(_code) == "run":
        RUNNABLE.setdefault(_p, []).append((_line, _code))


def _rel(p: str) -> str:
    return os.path.relpath(p, ROOT)


@pytest.mark.parametrize("page, line, code", [x for x in ALL if kind(x[2]) != "session"],
                         ids=[f"{_rel(p)}:{line}" for p, line, code in ALL if kind(code) != "session"])
def test_every_block_is_valid_python(page, line, code):
    compile(code, f"{_rel(page)}:{line}", "exec")


def test_fragments_say_what_they_need():
    bare = [f"{_rel(p)}:{line}" for p, line, code in ALL
            if kind(code) == "fragment" and not re.match(r"\s*# fragment: \S", code)]
    assert not bare, f"'# fragment:' must say what the block needs: {bare}"
    assert sum(len(v) for v in RUNNABLE.values()) >= 3  # the convention is for blocks that cannot run


@pytest.fixture(scope="module")
def docs_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("docs-data")
    rng = np.random.default_rng(0)
    for i, name in enumerate(("train", "web", "code", "books")):
        with tokenfeed.DatasetWriter(d / "data" / name, vocab_size=50257) as w:
            for _ in range(150):
                doc = rng.integers(0, 50256, int(rng.integers(50, 3000)), dtype=np.uint16)
                w.add_document(np.append(doc, 50256).astype(np.uint16))
    words = "the quick brown fox jumps over a lazy dog while tokens stream through packed batches".split()
    with open(d / "corpus.jsonl", "w") as f:
        for _ in range(400):
            f.write('{"text": "%s"}\n' % " ".join(rng.choice(words, 30)))
    return d


@pytest.mark.parametrize("page", sorted(RUNNABLE), ids=[_rel(p) for p in sorted(RUNNABLE)])
def test_blocks_run_as_written(page, docs_data):
    parts = []
    for line, code in RUNNABLE[page]:
        parts.append(f"# ---- {_rel(page)}:{line}\n{code}")
    script = docs_data / (re.sub(r"\W", "_", _rel(page)) + ".py")
    script.write_text("\n".join(parts))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(tokenfeed.__file__))]
                                                      + [x for x in sys.path if x]))
    r = subprocess.run([sys.executable, str(script)], cwd=docs_data, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"{_rel(page)}: a code block failed:\n{r.stderr[-3000:]}"


def test_the_quickstart_tokenizer_decodes_to_text(docs_data, tmp_path):
    """The tokenizer the quickstart trains turns ids back into text (what `tokenfeed explain
    --tokenizer` prints), not byte-level symbols such as "Ġfox"."""
    pytest.importorskip("tokenizers")
    page = os.path.join(DOCS, "quickstart.md")
    (code,) = [c for _, c in blocks(page) if "tok.train(" in c]
    os.symlink(docs_data / "corpus.jsonl", tmp_path / "corpus.jsonl")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "the quick brown fox jumps over a lazy dog"
    assert tok.decode(tok.encode(text).ids) == text
