"""The loader state crosses the language boundary: a C trainer's loader saves a state
(``tf_loader_state_save``) that a Python loader resumes exactly, and back
(``tf_loader_state_load``), for a plain loader, a mixture resumed under other weights (the
hand-over, strict and lenient) and with settings given by name through the settings table.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, List

import numpy as np
import pytest

import tokenfeed

HERE = Path(__file__).parent.parent  # tests/


def fnv1a(h: int, tokens: np.ndarray) -> int:
    for t in tokens.astype(np.uint32).astype(np.uint64).ravel().tolist():
        h = ((h ^ t) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@pytest.fixture(scope="module")
def tool(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed (the build needs one too)"
    lib = tokenfeed.get_library()
    exe = str(tmp_path_factory.mktemp("tool") / "state_tool")
    libdir = os.path.dirname(lib)
    cmd = [cc, "-O1", "-Wall", "-Wextra", "-Werror", "-std=c11", "-I", tokenfeed.get_include(),
           str(HERE / "c" / "state_tool.c"), "-L", libdir, "-ltokenfeed", f"-Wl,-rpath,{libdir}", "-o", exe]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, " ".join(cmd) + "\n" + p.stderr
    return exe


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> List[str]:
    rng = np.random.default_rng(3)
    root = tmp_path_factory.mktemp("cdata")
    out = []
    for name, n in (("a", 200), ("b", 90)):
        with tokenfeed.DatasetWriter(root / name, vocab_size=1000) as w:
            for _ in range(n):
                w.add_document(rng.integers(0, 990, size=int(rng.integers(1, 50))))
        out.append(str(root / name))
    return out


def run(tool: str, *args: Any) -> str:
    p = subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"checksum ([0-9a-f]{16}) position (\d+)", p.stdout)
    assert m, p.stdout
    return m.group(1)


def python_loader(paths: List[str], weights: Any = None, **kw: Any) -> tokenfeed.Loader:
    kw = dict(seq_len=16, batch_size=4, seed=3, dtype="int32", output="numpy", num_threads=1, **kw)
    if weights is None:
        return tokenfeed.Loader(paths[0], **kw)
    return tokenfeed.Loader(paths, weights=weights, **kw)


def checksum(loader: tokenfeed.Loader, n: int) -> str:
    h = 0xCBF29CE484222325
    for _ in range(n):
        h = fnv1a(h, np.asarray(next(loader)["tokens"]))
    return f"{h:016x}"


def test_c_saves_python_resumes(tool, paths, tmp_path):
    st = tmp_path / "state.json"
    want = run(tool, "save", st, 3, 5, paths[0], "packing=best_fit", "pad_id=999", "shuffle=block", "block_size=7")
    py = python_loader(paths, packing="best_fit", pad_id=999, shuffle="block", block_size=7)
    py.load_state_dict(__import__("json").loads(st.read_text()))
    assert py.position == 12
    assert checksum(py, 5) == want


def test_python_saves_c_resumes(tool, paths, tmp_path):
    py = python_loader(paths, weights=[0.7, 0.3], epochs=3)
    checksum(py, 4)
    st = tmp_path / "state.json"
    st.write_text(__import__("json").dumps(py.state_dict()))
    want = checksum(py, 5)
    assert run(tool, "load", st, 5, paths[0], paths[1], 0.7, 0.3, "epochs=3") == want


def test_reweighted_mixture_hands_over_in_c_as_in_python(tool, paths, tmp_path):
    """A 70/30 state resumed under 40/60: C finds the same hand-over as Python, leniently;
    the state then saved (it carries the anchor) resumes strictly on either side."""
    old = python_loader(paths, weights=[0.7, 0.3])
    checksum(old, 3)
    st = tmp_path / "old.json"
    st.write_text(__import__("json").dumps(old.state_dict()))
    py = python_loader(paths, weights=[0.4, 0.6])
    py.load_state_dict(old.state_dict(), strict=False)
    want = checksum(py, 6)
    assert run(tool, "load", st, 6, paths[0], paths[1], 0.4, 0.6, "--lenient") == want
    # the state of the handed-over loader: strict, into a fresh C loader and a fresh Python one
    anchored = tmp_path / "anchored.json"
    state = py.state_dict()
    assert state["mix_anchor"] is not None
    anchored.write_text(__import__("json").dumps(state))
    want = checksum(py, 4)
    assert run(tool, "load", anchored, 4, paths[0], paths[1], 0.4, 0.6) == want
    fresh = python_loader(paths, weights=[0.4, 0.6])
    fresh.load_state_dict(state)
    assert checksum(fresh, 4) == want


def test_c_refuses_with_a_sentence(tool, paths, tmp_path):
    st = tmp_path / "state.json"
    run(tool, "save", st, 2, 1, paths[0])
    p = subprocess.run([tool, "load", str(st), "1", paths[0], "seed=4"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "the loader configuration changed (seed: saved 3, now 4)" in p.stderr


def run_lines(tool: str, *args: Any) -> List[str]:
    p = subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout.splitlines()


def test_takedown_in_a_python_state_is_seen_by_c(tool, paths, tmp_path):
    """Documents taken down in Python are in the C state: a C trainer resuming it reads the same
    takedowns from its loader's order, after a mixture's hand-over too."""
    py = python_loader(paths, weights=[0.7, 0.3])
    checksum(py, 2)
    py.exclude([7, 3, 3, 50], source=1)
    checksum(py, 1)
    py.exclude([0], source=0)
    st = tmp_path / "state.json"
    st.write_text(__import__("json").dumps(py.state_dict()))
    assert py.state_dict()["excluded"] == [[8, 1, [3, 7, 50]], [12, 0, [0]]]
    lines = run_lines(tool, "load", st, 0, paths[0], paths[1], 0.7, 0.3)
    assert lines[:2] == ["excluded 8 1 3 7 50", "excluded 12 0 0"]
    # resumed under other weights (a hand-over to another order): the takedowns go with it
    lines = run_lines(tool, "load", st, 0, paths[0], paths[1], 0.4, 0.6, "--lenient")
    assert lines[:2] == ["excluded 8 1 3 7 50", "excluded 12 0 0"]
    py2 = python_loader(paths, weights=[0.4, 0.6])
    py2.load_state_dict(py.state_dict(), strict=False)
    assert py2.state_dict()["excluded"] == [[8, 1, [3, 7, 50]], [12, 0, [0]]]
    py2.set_weights([0.5, 0.5])  # a hand-over made while the run goes on
    assert py2.state_dict()["excluded"] == [[8, 1, [3, 7, 50]], [12, 0, [0]]]


@pytest.mark.parametrize("bad, words", [
    ([[0, 0, [200]]], "document 200 of source 0, which has 200"),      # past the documents
    ([[0, 2, [1]]], "names source 2"),                                   # no such source
    ([[0, 0, [5, 5]]], "ascending and distinct"),                        # a duplicate
    ([[0, 0, [9, 4]]], "ascending and distinct"),
    ([[0, 0, ["4"]]], "excluded document id"),                           # wrong type
    ([[0, 0, [-1]]], "excluded document id"),
    ([[0, 0, [1.5]]], "excluded document id"),
    ([[0, 0]], "excluded"),
    ({"a": 1}, "excluded"),
    ([[0, 0, [1]]] * 4097, "TF_STATE_MAX_EXCLUDED"),                     # a huge count
    ([[0, 0, list(range(1 << 22))], [0, 0, [1]]], "TF_STATE_MAX_EXCLUDED_IDS"),
])
def test_c_refuses_a_hostile_takedown(tool, paths, tmp_path, bad, words):
    py = python_loader(paths)
    state = py.state_dict()
    st = tmp_path / "state.json"
    st.write_text(__import__("json").dumps(dict(state, excluded=bad)))
    if st.stat().st_size < (1 << 16):  # what the tool reads; the bigger ones go through Python's loader
        p = subprocess.run([tool, "load", str(st), "1", paths[0]], capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and words in p.stderr, p.stderr
    with pytest.raises(tokenfeed.StateError, match=re.escape(words)):
        python_loader(paths).load_state_dict(dict(state, excluded=bad))


def test_a_state_without_excluded_still_loads(tool, paths, tmp_path):
    """States written before takedowns were kept by the C library have no excluded key."""
    py = python_loader(paths)
    checksum(py, 2)
    state = py.state_dict()
    del state["excluded"]
    st = tmp_path / "state.json"
    st.write_text(__import__("json").dumps(state))
    want = checksum(py, 3)
    assert run(tool, "load", st, 3, paths[0]) == want
    fresh = python_loader(paths)
    fresh.load_state_dict(state)
    assert fresh.state_dict()["excluded"] is None and checksum(fresh, 3) == want
