"""The settings table of the C library is the one definition of every setting: the
binding's keywords, ``_core.pyi``, the Loader's pass-through and ``docs/settings.md``
all agree with its rows."""
from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path
from typing import Any, Dict, List, Set

import numpy as np
import pytest

import tokenfeed
from tokenfeed import _core
from tokenfeed.order._config import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "settings.md"
STUB = ROOT / "python" / "tokenfeed" / "_core.pyi"


def _value(row: Dict[str, Any], v: int) -> str:
    if row["nullable"] and v == row["none_value"]:
        return "None"
    if row["type"] == "enum":
        return f'"{row["names"][v]}"'
    if row["type"] == "bool":
        return str(bool(v))
    return str(v)


def _bounds(row: Dict[str, Any]) -> str:
    if row["type"] == "enum":
        return ", ".join(f'"{n}"' for n in row["names"])
    if row["type"] == "bool":
        return "True, False"
    if row["type"] == "path":
        return "a path"
    hi = {2**64 - 1: "2^64 - 1", 2**63 - 1: "2^63 - 1", 2**32 - 1: "2^32 - 1", 2**32 - 2: "2^32 - 2"}
    return f"{row['min']} .. {hi.get(row['max'], str(row['max']))}"


def settings_table() -> str:
    """The table docs/settings.md must hold, from _core.settings()."""
    lines = ["| setting | scope | default | values | changes the stream | what it is |", "|---|---|---|---|---|---|"]
    for r in _core.settings():
        lines.append(f"| `{r['name']}` | {r['scope']} | `{_value(r, r['default'])}` | {_bounds(r)} | {r['stream']} | "
                     f"{r['description']} |")
    return "\n".join(lines)


def test_docs_table_is_the_c_table():
    text = DOC.read_text()
    assert settings_table() in text, "docs/settings.md: regenerate the table from tests/order/test_settings.py"


def _stub_keywords(cls: str) -> Set[str]:
    tree = ast.parse(STUB.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__new__":
                    return {a.arg for a in f.args.kwonlyargs + f.args.args}
    raise AssertionError(cls)


@pytest.mark.parametrize("cls,scope", [("Order", "order"), ("Loader", "engine"), ("DeviceLoader", "device"),
                                       ("Remote", "remote")])
def test_stub_names_every_row_of_its_scope(cls, scope):
    rows = {r["name"] for r in _core.settings() if r["scope"] == scope}
    assert rows <= _stub_keywords(cls), rows - _stub_keywords(cls)


def test_binding_takes_every_row_and_refuses_the_rest(tmp_path):
    with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=100) as w:
        for i in range(50):
            w.add_document(np.arange(i % 7 + 3) % 90)
    src = tokenfeed.open(tmp_path / "d")._core
    for r in _core.settings():
        if r["scope"] == "order":
            if r["name"] != "seq_len":  # None: the default, accepted by every row
                _core.Order(src, **{"seq_len": 4, r["name"]: None})
            with pytest.raises((ValueError, TypeError), match=r["name"]):
                _core.Order(src, **{"seq_len": 4, r["name"]: "x" if r["type"] != "enum" else "nonsense"})
    order = _core.Order(src, seq_len=4, global_batch=2)
    for r in _core.settings():
        if r["scope"] == "engine" and r["name"] not in ("batch_size", "dp_size", "dp_rank", "cp_rank"):
            _core.Loader(order, batch_size=2, **{r["name"]: None}).close()


def test_bounds_are_the_rows():
    assert SETTINGS["num_threads"]["max"] == _core.MAX_THREADS
    assert SETTINGS["pack_window"]["max"] == 1 << 24
    assert SETTINGS["shuffle"]["names"] == ["none", "full", "block"]


def test_every_row_is_a_loader_keyword_or_derived(tmp_path):
    """The Loader passes every row through (global_batch is batch_size x dp_size)."""
    with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=100) as w:
        for i in range(50):
            w.add_document(np.arange(i % 7 + 3) % 90)
    for r in _core.settings():
        if r["name"] in ("global_batch", "dp_rank", "dp_size", "cp_rank", "cp_size") or r["scope"] in ("device", "remote"):
            continue  # derived, the Loader's own keywords (with a mesh's rules), or open()'s
        v = r["default"] if not r["nullable"] else None
        if r["type"] == "enum":
            v = r["names"][r["default"]]
        elif r["type"] == "bool":
            v = bool(v)
        kw = {"seq_len": 4, "batch_size": 2, r["name"]: v} if r["name"] not in ("seq_len", "batch_size") else \
            {"seq_len": 4, "batch_size": 2}
        tokenfeed.Loader(tmp_path / "d", output="numpy", **kw).close()
    with pytest.raises(TypeError, match="global_batch"):
        tokenfeed.Loader(tmp_path / "d", seq_len=4, batch_size=2, global_batch=4)
    with pytest.raises(TypeError, match="pack_windw"):
        tokenfeed.Loader(tmp_path / "d", seq_len=4, batch_size=2, pack_windw=4)


# What a row's value needs beside it to make a loader (a rank below the size, a warmup's
# two halves, a share of the sample that divides it); the value itself is the row's own.
_COMPANIONS: Dict[str, Dict[str, Any]] = {
    "dp_rank": {"dp_size": 2}, "dp_size": {"dp_rank": 0}, "cp_rank": {"cp_size": 2}, "cp_size": {"cp_rank": 0}, "warmup_steps": {"warmup_min_seq_len": 4},
    "warmup_min_seq_len": {"warmup_steps": 3}, "packing": {"pad_id": 0},
}


def _non_default(row: Dict[str, Any]) -> Any:
    """A valid value of the row, other than its default (and not its None), as a keyword takes it."""
    if row["type"] == "enum":
        return next(n for i, n in enumerate(row["names"]) if i != row["default"])
    if row["type"] == "bool":
        return not row["default"]
    if row["type"] == "path":
        return "a path"  # the caller makes one where one is read
    for v in range(row["min"], row["min"] + 4):
        if v != row["default"] and not (row["nullable"] and v == row["none_value"]) and v <= row["max"]:
            return v
    raise AssertionError(row)


def _megatron_cache(tmp_path: Any, sizes: List[int], L: int, split: str = "train", extra: bool = True) -> str:
    """A GPTDataset index cache (in tmp_path/cache) over documents of these sizes, in order: one
    epoch, samples of L tokens (+ the extra token), unshuffled."""
    starts = np.concatenate([[0], np.cumsum(sizes)])
    n = (int(starts[-1]) - int(extra)) // L
    rows = []
    for s in range(n + 1):
        t = s * L
        d = min(int(np.searchsorted(starts, t, side="right") - 1), len(sizes) - 1)
        rows.append((d, t - int(starts[d])))
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    base = str(cache / f"0123abcd-GPTDataset-{split}-")
    np.save(base + "document_index.npy", np.arange(len(sizes), dtype=np.int32))
    np.save(base + "sample_index.npy", np.array(rows, dtype=np.int32))
    np.save(base + "shuffle_index.npy", np.arange(n, dtype=np.uint32))
    return str(cache)


@pytest.mark.parametrize("row", [r for r in _core.settings() if r["scope"] in ("order", "engine")],
                         ids=lambda r: r["name"])
def test_every_row_given_to_the_loader_reaches_its_layer(tmp_path, row):
    """Every order and engine row, set through Loader to a value other than its default, is what
    the C order or the C engine holds (their settings(), read back by name from tf_order_get_config /
    tf_loader_get_config): a row the Loader accepted and left behind would show its default."""
    with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=100) as w:
        for i in range(50):
            w.add_document(np.arange(i % 7 + 3) % 90)
    name, v = row["name"], _non_default(row)
    if name == "global_batch":  # not a keyword: batch_size x dp_size
        ld = tokenfeed.Loader(tmp_path / "d", seq_len=8, batch_size=3, dp_rank=1, dp_size=2, output="numpy")
        assert ld._order.settings()["global_batch"] == 6
        return
    kw: Dict[str, Any] = dict(seq_len=8, batch_size=2, output="numpy")
    kw.update(_COMPANIONS.get(name, {}))
    if name.startswith("megatron_"):  # Megatron's order needs its index cache
        kw.update(megatron_cache=_megatron_cache(tmp_path, [i % 7 + 3 for i in range(50)], 8,
                                                 split=v if name == "megatron_split" else "train",
                                                 extra=v if name == "megatron_add_extra_token" else True))
        if row["type"] == "path":
            v = kw["megatron_cache"]
    kw[name] = v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a configuration warned about (mostly padding, say) is still made
        ld = tokenfeed.Loader(tmp_path / "d", **kw)
    layer = ld._order if row["scope"] == "order" else ld._engine
    got = layer.settings()
    assert set(got) == {r["name"] for r in _core.settings() if r["scope"] == row["scope"]}
    assert got[name] == v, f"{name}={v!r} given to the Loader, the {row['scope']} holds {got[name]!r}"
    ld.close()


def test_every_device_row_reaches_the_device_stage(tmp_path):
    """Every device row given to the Loader is checked by its row in the device stage, before
    CUDA is looked for: a value past the row's bounds is refused naming it, on any machine."""
    with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=100) as w:
        for i in range(50):
            w.add_document(np.arange(i % 7 + 3) % 90)
    for r in _core.settings():
        if r["scope"] == "device":
            with pytest.raises(ValueError, match=r["name"]):
                tokenfeed.Loader(tmp_path / "d", seq_len=8, batch_size=2, device="cuda", **{r["name"]: r["max"] + 1})


def test_a_new_engine_row_is_passed_to_the_engine(tmp_path, monkeypatch):
    """The Loader hands the engine every engine row it is given, by the table, not by a list of
    its own: a row the table gains (here one the C engine does not know yet) reaches the C
    engine, which names it, rather than being accepted and dropped."""
    from tokenfeed.order import _config

    with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=100) as w:
        for i in range(50):
            w.add_document(np.arange(i % 7 + 3) % 90)
    row = dict(SETTINGS["balance_micro_batches"], name="future_engine_row")
    monkeypatch.setitem(_config.SETTINGS, "future_engine_row", row)
    with pytest.raises(TypeError, match="future_engine_row"):
        tokenfeed.Loader(tmp_path / "d", seq_len=8, batch_size=2, future_engine_row=2)


def test_old_names_warn_and_still_work(tmp_path):
    with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=100) as w:
        for i in range(50):
            w.add_document(np.arange(i % 7 + 3) % 90)
    with pytest.warns(DeprecationWarning, match="prefetch= is now prefetch_batches="):
        ld = tokenfeed.Loader(tmp_path / "d", seq_len=4, batch_size=2, prefetch=3, output="numpy")
    assert ld._engine_cfg.setting("prefetch_batches") == 3 and ld._engine.settings()["prefetch_batches"] == 3
    with pytest.raises(TypeError, match="pass only prefetch_batches="):
        tokenfeed.Loader(tmp_path / "d", seq_len=4, batch_size=2, prefetch=3, prefetch_batches=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenfeed.Loader(tmp_path / "d", seq_len=4, batch_size=2, prefetch_batches=3, output="numpy").close()
    with pytest.warns(DeprecationWarning, match="device_prefetch= is now device_prefetch_batches="):
        with pytest.raises(ValueError, match="device_prefetch_batches"):  # checked before CUDA is looked for
            tokenfeed.Loader(tmp_path / "d", seq_len=4, batch_size=2, device="cuda", device_prefetch=0)


def test_c_bounds_query():
    import ctypes

    lib = ctypes.CDLL(tokenfeed.get_library())
    lo, hi = ctypes.c_int64(), ctypes.c_uint64()
    lib.tf_setting_bounds.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_uint64)]
    assert lib.tf_setting_bounds(b"pack_window", ctypes.byref(lo), ctypes.byref(hi)) == 0
    assert (lo.value, hi.value) == (1, 1 << 24)
    assert lib.tf_setting_bounds(b"no_such_setting", ctypes.byref(lo), ctypes.byref(hi)) < 0


class _NoTransport:
    """A transport that is never asked: Remote() only opens the cache."""

    def stat(self, url: str) -> Any:
        raise AssertionError(url)

    def read_into(self, *args: Any) -> int:
        raise AssertionError(args)


def test_remote_rows_are_the_remote_defaults_and_bounds(tmp_path):
    """Remote reading reads its defaults and bounds from its rows: None (0) is the row's
    default, a value outside the row is refused naming it, and the Loader takes none of them."""
    rows = {r["name"]: r for r in _core.settings() if r["scope"] == "remote"}
    assert {"cache_limit", "chunk_bytes", "prefetch_bytes", "fetch_threads", "max_attempts", "deadline_ms"} <= set(rows)
    assert rows["fetch_threads"]["default"] == 16 and rows["fetch_threads"]["max"] == _core.MAX_THREADS
    st = _core.Remote(_NoTransport(), tmp_path / "c", cache_limit=64 << 20).stats()
    assert st["chunk_bytes"] == rows["chunk_bytes"]["default"]
    for name in ("fetch_threads", "max_attempts", "chunk_bytes"):
        with pytest.raises(ValueError, match=name):
            _core.Remote(_NoTransport(), tmp_path / "c", cache_limit=64 << 20, **{name: rows[name]["max"] + 1})
    with pytest.raises(ValueError, match="fetch_threads must be an int from 1 to 256"):
        tokenfeed.open("s3://bucket/key.bin", fetch_threads=257)
    with tokenfeed.DatasetWriter(tmp_path / "d", vocab_size=100) as w:
        w.add_document(np.arange(20) % 90)
    with pytest.raises(TypeError, match="fetch_threads"):
        tokenfeed.Loader(tmp_path / "d", seq_len=4, batch_size=2, fetch_threads=4)
