#!/usr/bin/env python3
"""Check that the C core and the Python package keep their layers (docs/design.md).

    python3 tests/check_layers.py          # prints the graphs, exits 1 on a violation

C layers, bottom to top: common < sources < remote < order < engine < device. A file may use
(include, or call a function defined in) files of its own layer or of lower layers,
never of a higher one; csrc/include/tokenfeed.h (the public API) may be included by
anyone. The binding (csrc/python) sees only the public header and its own files.
Two graphs are checked:

- includes: every ``#include "..."`` between files of csrc/;
- calls: for every object file, the tf_/tf__ symbols it uses and which object file
  defines them (``nm`` on objects compiled here), so a call that goes upward or round
  in a circle is found even when no header says so.

And the Python package's imports (``from . import x``, ``from ..room.x import y``): its
subpackages are the same rooms in the same order (python/tokenfeed/common, sources, remote,
order, engine, device), so a room's module imports its own room, lower rooms and the extension
module, never a higher room nor the face users import (the package itself, torch, flex,
integrations, cli), which may import any room; the few imports that still go up are listed in
PY_UPWARD with their reasons. In all three graphs no two files depend on each other in a circle,
directly or not.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, Iterable, List, Optional, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
PKG = os.path.join(ROOT, "python", "tokenfeed")

# The layer of each directory of csrc/, in the order of docs/design.md ("Layers").
# remote/ (object storage: transport, fetch pool, chunk cache, scheduler) sits above the
# format parsers: it opens remote files with them and serves their bytes through the byte
# provider of a tf_file (sources/source.h), so no parser names it.
C_LAYERS = {"common": 0, "sources": 1, "remote": 2, "order": 3, "engine": 4, "device": 5}
PUBLIC = "include/tokenfeed.h"

# The Python package has the same rooms, as subpackages of the same names (python/tokenfeed/common,
# sources, ...) in the same order. Its other modules are the face users import: the package itself
# (__init__), torch, flex, integrations.*, cli.* and __main__. They may import any room; a room's module
# imports its own room, lower rooms and the extension module (tokenfeed._core, the binding), never a
# higher room or the face.
BINDING_PY = "_core"
# The imports that still go up, each with why. The checker fails on any other, and on one of these
# that is gone (so the list only shrinks): each is a dependency to turn round, not a pattern to copy.
# A key's second name is a module, or a room (any of its modules).
PY_UPWARD = {
    ("sources._dataset", "remote"): "open() takes URLs and remote shard sets: it builds their stores, expands "
                                    "the sets and keeps the node's record of them",
    ("engine._loader", "device._device"): "Loader(device=) builds its device stage over the engine",
    ("engine._loader", "flex"): "Loader(document_ids=True) gives the FlexAttention document ids",
    ("sources._convert", "integrations.datatrove"): "convert --tasks runs the conversion as datatrove tasks",
}
BINDING = "python"

Graph = Dict[str, Set[str]]


def c_files() -> List[str]:
    out = []
    for d in list(C_LAYERS) + ["include", BINDING]:
        for f in sorted(os.listdir(os.path.join(CSRC, d))):
            if f.endswith((".c", ".h")):
                out.append(f"{d}/{f}")
    return out


def include_graph() -> Graph:
    g: Graph = {}
    for f in c_files():
        deps = g.setdefault(f, set())
        with open(os.path.join(CSRC, f), encoding="utf-8") as fh:
            for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', fh.read(), re.M):
                target = os.path.normpath(os.path.join(os.path.dirname(f), inc))
                if not os.path.exists(os.path.join(CSRC, target)):
                    target = os.path.normpath(os.path.join("include", inc))  # -Iinclude
                if not os.path.exists(os.path.join(CSRC, target)):
                    raise SystemExit(f"{f}: cannot resolve #include \"{inc}\"")
                deps.add(target)
    return g


def call_graph(cc: str = "") -> Graph:
    """Object file -> object files whose tf_/tf__ symbols it uses (library only)."""
    cc = cc or os.environ.get("CC", "cc")
    if not shutil.which(cc) or not shutil.which("nm"):
        raise RuntimeError(f"need a C compiler ({cc}) and nm")
    srcs = [f for f in c_files() if f.endswith(".c") and f.split("/")[0] in C_LAYERS]
    defined: Dict[str, str] = {}
    used: Dict[str, Set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for f in srcs:
            obj = os.path.join(tmp, f.replace("/", "_") + ".o")
            subprocess.run([cc, "-std=c11", "-O0", "-D_GNU_SOURCE", "-DTF_HAVE_CUDA_LAYER=1", "-I", "include", "-I", ".",
                            "-c", f, "-o", obj], cwd=CSRC, check=True, capture_output=True)
            out = subprocess.run(["nm", obj], check=True, capture_output=True, text=True).stdout
            used[f] = set()
            for line in out.splitlines():
                parts = line.split()
                if not parts or not parts[-1].startswith("tf_"):
                    continue
                sym, kind = parts[-1], parts[-2]
                if kind == "U":
                    used[f].add(sym)
                elif kind.isupper():  # defined and global
                    defined[sym] = f
    g: Graph = {}
    for f, syms in used.items():
        g[f] = {defined[s] for s in syms if s in defined and defined[s] != f}
    return g


def binding_private_symbols(cc: str = "", include_dirs: Iterable[str] = ()) -> Dict[str, Set[str]]:
    """Symbols of the library's insides (tf__*) that binding files use: none may be."""
    cc = cc or os.environ.get("CC", "cc")
    incs = [x for d in include_dirs for x in ("-I", d)]
    out: Dict[str, Set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for f in c_files():
            if not (f.startswith(BINDING + "/") and f.endswith(".c")):
                continue
            obj = os.path.join(tmp, f.replace("/", "_") + ".o")
            subprocess.run([cc, "-std=c11", "-O0", "-D_GNU_SOURCE", "-I", "include", *incs, "-c", f, "-o", obj],
                           cwd=CSRC, check=True, capture_output=True)
            nm = subprocess.run(["nm", "-u", obj], check=True, capture_output=True, text=True).stdout
            out[f] = {line.split()[-1] for line in nm.splitlines() if line.split()[-1].startswith("tf__")}
    return out


def python_graph() -> Graph:
    """Module -> modules of the package it imports (relative imports), subpackages included:
    a module of ``integrations/`` is named ``integrations.datatrove``."""
    mods: Dict[str, str] = {}  # dotted name -> file
    for d, _, files in os.walk(PKG):
        rel = os.path.relpath(d, PKG)
        prefix = "" if rel == "." else rel.replace(os.sep, ".") + "."
        for f in files:
            if f.endswith(".py"):
                name = prefix + f[:-3]
                mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = os.path.join(d, f)
    g: Graph = {}
    extension = {BINDING_PY}  # the extension module: imported, never read (its stub, _core.pyi, is what it offers)
    for m in sorted(mods):
        deps = g.setdefault(m, set())
        # the package a relative import starts from: a module's parent, or an __init__'s own package
        parts = m.split(".") if mods[m].endswith("__init__.py") and m != "__init__" else m.split(".")[:-1]
        with open(mods[m], encoding="utf-8") as fh:
            src = fh.read()
        for dots, a, b in re.findall(r"^\s*from (\.+)([\w.]*) import (\([^)]*\)|[\w, ]+)", src, re.M):
            base = parts[:len(parts) - (len(dots) - 1)] if len(dots) - 1 <= len(parts) else []
            pkg = base + a.split(".") if a else base
            names = []
            # from .x import y / from . import x, y / from ..room import (x,\n y): each name that is a
            # module is that module, any other is a name of the module (or package) it comes from
            for n in re.findall(r"\w+", re.sub(r" as \w+", "", b)):
                sub = ".".join(pkg + [n])
                names.append(sub if sub in mods or sub in extension else ".".join(pkg) or "__init__")
            deps.update(n for n in names if (n in mods or n in extension) and n != m)
    return g


def layer(f: str) -> int:
    return C_LAYERS.get(f.split("/")[0], -1)


def layer_violations(g: Graph) -> List[str]:
    bad = []
    for f, deps in sorted(g.items()):
        top = f.split("/")[0]
        for d in sorted(deps):
            if d == PUBLIC:
                continue
            if top == BINDING:
                if not d.startswith(BINDING + "/"):
                    bad.append(f"{f} -> {d}: the binding uses the public API only")
            elif top == "include":
                bad.append(f"{f} -> {d}: the public header stands alone")
            elif d.split("/")[0] == BINDING or layer(d) > layer(f):
                bad.append(f"{f} -> {d}: {top} is below {d.split('/')[0]}")
    return bad


def py_room(m: str) -> int:
    """The room of a module of the Python package (its C layer), or -1 for the face (and the extension)."""
    return C_LAYERS.get(m.split(".")[0], -1)


def py_layer_violations(g: Graph, allowed: Optional[Dict[Tuple[str, str], str]] = None) -> List[str]:
    """Imports of a room's module that go to a higher room or to the face, less ``allowed``; and an
    allowed import that no longer occurs (the list is kept to what is)."""
    allowed = PY_UPWARD if allowed is None else allowed
    bad, seen = [], set()
    for m, deps in sorted(g.items()):
        r = py_room(m)
        if r < 0:
            continue  # the face imports anything
        for d in sorted(deps):
            if d == BINDING_PY or (py_room(d) >= 0 and py_room(d) <= r):
                continue
            key = next((k for k in ((m, d), (m, d.split(".")[0])) if k in allowed), None)
            if key is not None:
                seen.add(key)
                continue
            where = d.split(".")[0] if py_room(d) >= 0 else "the face (" + d + ")"
            bad.append(f"{m} -> {d}: {m.split('.')[0]} is below {where}")
    for m, d in sorted(set(allowed) - seen):
        if m in g:  # a graph of the package (a test's small graph names only what it checks)
            bad.append(f"{m} -> {d}: listed as an allowed upward import in check_layers.PY_UPWARD, but no longer "
                       f"made: remove it from the list")
    return bad


def cycles(g: Graph) -> List[List[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def report(name: str, g: Graph, layered: bool, python: bool = False) -> Tuple[List[str], List[List[str]]]:
    bad = (py_layer_violations(g) if python else layer_violations(g)) if layered else []
    circ = cycles(g)
    print(f"== {name}: {len(g)} files, {sum(len(d) for d in g.values())} edges")
    for f, deps in sorted(g.items()):
        if deps:
            print(f"  {f} -> {', '.join(sorted(deps))}")
    for b in bad:
        print(f"  LAYER VIOLATION {b}")
    for c in circ:
        print(f"  CYCLE {' <-> '.join(c)}")
    return bad, circ


def main(argv: Iterable[str] = ()) -> int:
    failed = False
    for name, g, layered, py in (("C includes", include_graph(), True, False), ("C calls", call_graph(), True, False),
                                 ("Python imports", python_graph(), True, True)):
        bad, circ = report(name, g, layered, py)
        failed |= bool(bad or circ)
    print("FAIL" if failed else "OK: every dependency goes down the layers, and none goes round in a circle")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
