"""Every setting of the C settings table is a keyword that ``inspect``, IDEs and mypy see.

``Loader`` and ``tokenfeed.torch.TokenDataset`` write the settings table's rows out as
keyword-only parameters, between marker lines that ``tests/gen_signatures.py`` fills from
``_core.settings()``; what each keyword does once given is tested row by row in
``tests/order/test_settings.py``.
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

import tokenfeed
from tokenfeed import _core
from tokenfeed.order._config import SETTINGS, keyword_default, settings_given

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests"))
import gen_signatures  # noqa: E402


def test_the_written_keywords_are_the_table():
    """The blocks in the source are what the generator writes from the table now: a row added,
    removed or changed in C without regenerating them fails here, naming the file."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gen_signatures.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("scopes,where", [(("order", "engine", "device"), "Loader"), (("order",), "TokenDataset")])
def test_inspect_lists_every_row(scopes, where):
    """inspect.signature lists every row of the signature's scopes (global_batch, which is
    batch_size x dp_size, aside), with the default the table gives, and no catch-all **kwargs
    that would hide a misspelt keyword."""
    if where == "Loader":
        cls = tokenfeed.Loader
    else:
        from tokenfeed.torch import TokenDataset as cls  # torch is in the test extra
    params = inspect.signature(cls).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    for row in _core.settings():
        if row["scope"] not in scopes or row["name"] == "global_batch":
            continue
        assert row["name"] in params, f"{where} has no keyword {row['name']}"
    for name in (tokenfeed.engine._loader.LOADER_SETTINGS if where == "Loader" else
                 sys.modules["tokenfeed.torch"].TOKEN_DATASET_SETTINGS):
        assert params[name].default == keyword_default(SETTINGS[name]), name
        assert params[name].kind is params[name].KEYWORD_ONLY


def test_a_row_the_table_gains_is_written_out():
    """The generator writes a parameter for a row it has never seen, typed from the row: an enum
    as a Literal of its names, a nullable int as Optional[int] = None."""
    rows = _core.settings() + [
        dict(SETTINGS["balance"], name="future_enum_row"),
        dict(SETTINGS["num_threads"], name="future_int_row"),
    ]
    lines = "\n".join(gen_signatures.block(rows, "Loader", ["future_enum_row", "future_int_row"]))
    assert 'future_enum_row: Optional[Literal["none", "tokens", "attention", "strided"]] = None' in lines
    assert "future_int_row: Optional[int] = None" in lines


def test_only_keywords_set_are_passed_on(tmp_path):
    """A keyword left at the default the signature shows is not passed on (the layer applies its
    own default); one set to anything else is, a value of the wrong type included, which its row
    then refuses by name rather than it being mistaken for the default."""
    assert settings_given({"seed": 0, "packing": "concat", "num_threads": None}, ["seed", "packing",
                                                                                  "num_threads"]) == {}
    assert settings_given({"seed": False, "direct_io": 0}, ["seed", "direct_io"]) == {"seed": False,
                                                                                       "direct_io": 0}
    with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=100) as w:
        for i in range(20):
            w.add_document(np.arange(i % 7 + 3) % 90)
    with pytest.raises(TypeError, match="seed"):
        tokenfeed.Loader(tmp_path / "d", seq_len=4, batch_size=2, seed=False)
    with pytest.raises(TypeError, match="pack_windw"):
        tokenfeed.Loader(tmp_path / "d", seq_len=4, batch_size=2, pack_windw=4)
