"""Public names: what the docs tell users to import exists in a public module, and the package's
exceptions show the name users import them by (``tokenfeed.StateError``, not the private module that
defines them)."""
from __future__ import annotations

import glob
import importlib
import os
import pickle
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tokenfeed

from conftest import ROOT

# docs/design.md describes the modules themselves (it names tokenfeed._core, the extension)
PAGES = sorted(p for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
               if not p.endswith(os.path.join("docs", "design.md"))) + [os.path.join(ROOT, "README.md")]
DOTTED = re.compile(r"\btokenfeed((?:\.[A-Za-z_]\w*)+)")
FROM_IMPORT = re.compile(r"^\s*from (tokenfeed(?:\.\w+)*) import ([\w, ()]+)", re.M)


def resolve(dotted: str) -> object:
    """tokenfeed.a.b.C: import the longest module prefix, then getattr the rest."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def doc_names() -> dict[str, set[str]]:
    """Dotted tokenfeed names (classes and functions; not file names such as tokenfeed.h or .tokenfeed.lock)
    by page."""
    out: dict[str, set[str]] = {}
    for page in PAGES:
        with open(page) as f:
            text = f.read()
        names = {"tokenfeed" + m for m in DOTTED.findall(text)}
        for mod, what in FROM_IMPORT.findall(text):
            names |= {f"{mod}.{n.strip()}" for n in what.strip("()").split(",") if n.strip()}
        out[os.path.relpath(page, ROOT)] = {n for n in names if not re.search(r"\.(h|pc|manifest|catalog|columns|map|c|lock)$", n)}
    return out


def test_docs_import_only_public_modules():
    # (a page may name the extension module tokenfeed._core as a part of the design, not import from it)
    private = {page: sorted(n for n in names if re.search(r"\._\w+\.", n)) for page, names in doc_names().items()}
    assert {p: n for p, n in private.items() if n} == {}, "docs that send users to a private module"


def test_every_name_the_docs_give_exists():
    missing = {}
    for page, names in doc_names().items():
        for name in sorted(names):
            try:
                resolve(name)
            except (ImportError, AttributeError) as e:
                missing.setdefault(page, []).append(f"{name} ({e})")
    assert missing == {}


def test_documented_classes_from_the_package():
    assert tokenfeed.DeviceFeeder is importlib.import_module("tokenfeed.device._device").DeviceFeeder
    assert tokenfeed.DeviceTensor is tokenfeed._core.DeviceTensor
    assert {"DeviceFeeder", "DeviceTensor"} <= set(tokenfeed.__all__)


@pytest.mark.parametrize("cls", [tokenfeed.StateError, tokenfeed.FormatError, tokenfeed.PerformanceWarning,
                                 tokenfeed.DataWarning])
def test_exceptions_carry_the_public_name(cls):
    assert cls.__module__ == "tokenfeed"
    assert repr(cls) == f"<class 'tokenfeed.{cls.__name__}'>"
    assert getattr(tokenfeed, cls.__name__) is cls
    e = pickle.loads(pickle.dumps(cls("why")))  # pickle finds the class by the public name
    assert type(e) is cls and str(e) == "why"


def test_traceback_prints_public_names(tmp_path):
    """An uncaught StateError (a state from another dataset) and FormatError (a bad file) end the
    traceback with ``tokenfeed.StateError: ...`` / ``tokenfeed.FormatError: ...``."""
    (tmp_path / "bad.npy").write_bytes(b"not a numpy file")
    np.save(tmp_path / "a.npy", np.arange(5000, dtype=np.uint16))
    np.save(tmp_path / "b.npy", np.arange(6000, dtype=np.uint16))
    code = textwrap.dedent("""
        import os, sys
        import tokenfeed
        d = os.path.dirname(sys.argv[2])
        a = tokenfeed.Loader(os.path.join(d, "a.npy"), seq_len=16, batch_size=2)
        b = tokenfeed.Loader(os.path.join(d, "b.npy"), seq_len=16, batch_size=2)
        if sys.argv[1] == "state":
            b.load_state_dict(a.state_dict())
        else:
            tokenfeed.open(sys.argv[2])
    """)
    for what, name in (("state", "tokenfeed.StateError: "), ("format", "tokenfeed.FormatError: ")):
        p = subprocess.run([sys.executable, "-c", code, what, str(tmp_path / "bad.npy")], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 1
        assert p.stderr.strip().splitlines()[-1].startswith(name), p.stderr[-2000:]
