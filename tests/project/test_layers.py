"""The layers of docs/design.md hold: in csrc/ every include and every call goes to
the same or a lower layer (common < sources < order < engine < device), the binding
uses the public API only, and no two files, C or Python, depend on each other in a
circle. The checker itself is tested on graphs that break each rule."""
from __future__ import annotations

import os
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
    assert "_config" in g["_loader"] and "_config" in g["torch"]  # one configuration, shared
    # subpackages and parenthesised imports are seen too
    assert {"_parts", "_text"} <= g["integrations.datatrove"]
    assert "_text" in g["_convert"] and "integrations.datatrove" in g["_convert"]


def test_checker_finds_what_it_must():
    assert cl.layer_violations({"common/sigbus.c": {"sources/source.h"}})  # common above nothing
    assert cl.layer_violations({"order/mix.c": {"engine/engine.h"}})
    assert cl.layer_violations({"python/x.c": {"order/kind.h"}})  # the binding sees the public API only
    assert not cl.layer_violations({"engine/read.c": {"sources/file.c", "include/tokenfeed.h"}})
    assert cl.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cl.cycles({"a": {"b"}, "b": set()}) == []
