"""The layers of docs/design.md hold: in csrc/ every include and every call goes to
the same or a lower layer (common < sources < remote < order < engine < device), the binding
uses the public API only, the Python package's subpackages keep the same order, and no two
files, C or Python, depend on each other in a circle. The checker itself is tested on graphs
that break each rule."""
from __future__ import annotations

import os
import re
import sys
import sysconfig

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for check_layers
import check_layers as cl  # noqa: E402


# Files whose place in the layers matters most: if one moved or was renamed without the
# checker seeing it, the checks below would pass on a graph without it.
EXPECTED_C = ["remote/remote.c", "remote/remote_cache.c", "remote/remote_open.c", "remote/remote_prefetch.c",
              "remote/remote_registry.c", "order/schedule.c", "engine/zcache.c", "engine/cp.c",
              "engine/remote_glue.c", "device/stage.c"]


def test_every_c_file_is_in_the_graphs():
    inc, calls = cl.include_graph(), cl.call_graph()
    sources = [f for f in cl.c_files() if f.split("/")[0] in cl.C_LAYERS and f.endswith(".c")]
    assert set(EXPECTED_C) <= set(sources)
    assert set(sources) <= set(inc) and set(sources) <= set(calls)
    # the device stage copies a loader's batches: it sits on the engine, never the reverse
    assert "engine/loader.c" in calls["device/stage.c"]
    # the engine tells the chunk scheduler (sources) what to fetch; sources never call the engine
    assert "remote/remote_prefetch.c" in calls["engine/remote_glue.c"]


def test_includes_go_down_the_layers():
    g = cl.include_graph()
    assert cl.layer_violations(g) == []
    assert cl.cycles(g) == []
    # common/ depends on nothing above it
    assert all(d.startswith(("common/", "include/")) for f, deps in g.items() if f.startswith("common/") for d in deps)


def test_calls_go_down_the_layers():
    g = cl.call_graph()
    assert cl.layer_violations(g) == []
    assert cl.cycles(g) == []
    assert all(d.startswith("common/") for f, deps in g.items() if f.startswith("common/") for d in deps)
    # the order layer's kinds are reached through order.c only, never the reverse
    assert "order/order.c" not in g["order/concat.c"] | g["order/pack.c"]


def test_binding_uses_the_public_api_only():
    incs = [sysconfig.get_paths()["include"], np.get_include()]
    assert {f: s for f, s in cl.binding_private_symbols(include_dirs=incs).items() if s} == {}


def test_python_imports_have_no_circle():
    g = cl.python_graph()
    assert cl.cycles(g) == []
    assert "order._config" in g["engine._loader"] and "order._config" in g["torch"]  # one configuration, shared
    # subpackages and parenthesised imports are seen too
    assert {"sources._parts", "sources._text"} <= g["integrations.datatrove"]
    assert "sources._text" in g["sources._convert"] and "integrations.datatrove" in g["sources._convert"]
    # `from ..remote import _remote` is the module, `from .. import _core` the extension
    assert "remote._remote" in g["cli._index"] and "_core" in g["sources._views"]


# Modules whose room matters most: if one moved out of its subpackage without the checker seeing
# it, the room checks below would pass on a graph without it.
EXPECTED_PY = {"common._errors": 0, "sources._dataset": 1, "remote._remote": 2, "order._config": 3,
               "engine._loader": 4, "device._device": 5, "torch": -1, "cli": -1, "integrations.hf": -1}


def test_python_rooms_keep_the_order_of_the_c_rooms():
    g = cl.python_graph()
    assert {m: cl.py_room(m) for m in EXPECTED_PY} == EXPECTED_PY
    assert cl.py_layer_violations(g) == []
    # every module of the package but the face is in a room
    face = {"__init__", "__main__", "torch", "flex", "integrations", "cli"}
    assert {m for m in g if cl.py_room(m) < 0 and m.split(".")[0] not in face} == set()
    # each room holds a module, and the subpackages are named as the C rooms are
    assert {m.split(".")[0] for m in g if cl.py_room(m) >= 0} == set(cl.C_LAYERS)


def test_python_room_checker_finds_what_it_must():
    v = cl.py_layer_violations
    assert v({"common._lock": {"engine._loader"}}, {})  # a lower room imports a higher one
    assert v({"sources._text": {"torch"}}, {})  # a room imports the face
    assert v({"order._x": {"__init__"}}, {})
    assert not v({"engine._loader": {"order._config", "sources._dataset", "common._errors", "engine._y", "_core"}}, {})
    assert not v({"torch": {"device._device"}, "cli._x": {"engine._loader"}, "integrations.hf": {"cli"}}, {})
    # an allowed upward import passes; one that is no longer made is reported, so the list only shrinks
    allowed = {("sources._a", "remote._b"): "why", ("sources._c", "remote"): "a room: any of its modules"}
    assert not v({"sources._a": {"remote._b"}, "sources._c": {"remote._b", "remote._d"}}, allowed)
    assert v({"sources._a": {"remote._b", "remote._d"}, "sources._c": {"remote._b"}}, allowed) == \
        ["sources._a -> remote._d: sources is below remote"]
    assert v({"sources._c": {"order._x"}, "sources._a": {"remote._b"}}, allowed)[0].startswith("sources._c -> order._x")
    assert v({"sources._a": set()}, allowed) == ["sources._a -> remote._b: listed as an allowed upward import in "
                                                 "check_layers.PY_UPWARD, but no longer made: remove it from the list"]


def test_a_planted_upward_import_is_reported(tmp_path, monkeypatch):
    # a copy of the package's Python files, one of them changed as a careless edit would
    pkg = tmp_path / "tokenfeed"
    for d, _, files in os.walk(cl.PKG):
        for f in files:
            if f.endswith((".py", ".pyi")):
                dst = pkg / os.path.relpath(os.path.join(d, f), cl.PKG)
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(open(os.path.join(d, f), "rb").read())
    monkeypatch.setattr(cl, "PKG", str(pkg))
    assert cl.py_layer_violations(cl.python_graph()) == []
    lock = pkg / "common" / "_lock.py"
    lock.write_text(lock.read_text() + "\n\ndef _f():\n    from ..engine import _loader\n    return _loader\n")
    assert cl.py_layer_violations(cl.python_graph()) == ["common._lock -> engine._loader: common is below engine"]
    lock.write_text(lock.read_text() + "\nfrom ..cli._common import PROG\n")
    assert "common._lock -> cli._common: common is below the face (cli._common)" in \
        cl.py_layer_violations(cl.python_graph())


def test_checker_finds_what_it_must():
    assert cl.layer_violations({"common/sigbus.c": {"sources/source.h"}})  # common above nothing
    assert cl.layer_violations({"order/mix.c": {"engine/engine.h"}})
    assert cl.layer_violations({"python/x.c": {"order/kind.h"}})  # the binding sees the public API only
    assert not cl.layer_violations({"engine/read.c": {"sources/file.c", "include/tokenfeed.h"}})
    assert cl.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cl.cycles({"a": {"b"}, "b": set()}) == []


def test_test_folders_are_rooms_on_the_path_with_unique_file_names():
    import tomllib

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(os.path.dirname(tests), "pyproject.toml"), "rb") as f:
        path = tomllib.load(f)["tool"]["pytest"]["ini_options"]["pythonpath"]
    by_name: dict = {}
    for d, _, files in os.walk(tests):
        for f in files:
            if f.startswith("test_") and f.endswith(".py"):
                by_name.setdefault(f, []).append(os.path.relpath(d, tests))
    # one module per name: with every folder on the path, a second test_x.py would shadow the first
    assert {f: ds for f, ds in by_name.items() if len(ds) > 1} == {}
    folders = {d for ds in by_name.values() for d in ds}
    # no test file at the top (it holds the helpers), and every folder with tests is on pytest's path
    assert "." not in folders
    assert {f"tests/{d}" for d in folders} <= set(path)
    # the folders are rooms of the package (common's few helpers are tested where they are used),
    # then the face's and the project's own
    assert folders == set(cl.C_LAYERS) - {"common"} | {"integrations", "cli", "project"}


# What a format keeps of its own (section offsets, checksums, tables) lives in its parser's
# struct inside tf_file's format_priv; what every layer may read of any format (compressed
# blocks, documents defined by an eos id) are named sub-structs of tf_file.
FORMAT_PRIVATE_ONCE_SHARED = {
    "compressed", "read_block", "zdata", "zdata_len", "block_table", "num_blocks", "block_tokens",
    "has_checksums", "tokens_checksum", "docs_checksum", "blocks_checksum", "tokens_section_len",
    "docs_section", "docs_section_len", "tokens_offset", "docs_offset", "chunk_sums", "num_chunk_sums",
    "chunk_sum_bytes", "chunks_checksum", "eos_mode", "docs_from_rows", "eos_id"}


def _struct_members(text: str, name: str) -> set:
    body = re.search(r"typedef struct %s \{(.*?)\n\} %s;" % (name, name), text, re.S)
    assert body, name
    code = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    # the last identifier of each declaration (before '[', ';', ',' or a function pointer's ')')
    return set(re.findall(r"\(?\*?\s*(\w+)\s*(?:\)\s*\(.*?\))?\s*(?:\[[^\]]*\])?\s*[;,]", code))


def test_a_formats_private_state_is_read_by_its_parser_only():
    src = open(os.path.join(cl.CSRC, "sources", "source.h")).read()
    members = _struct_members(src, "tf_file")
    assert {"blocks", "eos", "format_priv", "doc_kind"} <= members
    assert members & FORMAT_PRIVATE_ONCE_SHARED == set()
    # a format's private struct is reached (tf__format_priv) in its parser's file only
    users = {f for f in cl.c_files() if "tf__format_priv(" in open(os.path.join(cl.CSRC, f)).read()}
    assert users == {"sources/source.h", "sources/native.c", "sources/megatron.c"}
    # and no file but its parser names it
    for parser, struct in (("sources/native.c", "nat_file"), ("sources/megatron.c", "mg_file")):
        assert _struct_members(open(os.path.join(cl.CSRC, parser)).read(), struct)
        named = {f for f in cl.c_files() if re.search(r"\b%s\b" % struct, open(os.path.join(cl.CSRC, f)).read())}
        assert named == {parser}
