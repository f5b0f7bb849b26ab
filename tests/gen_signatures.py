#!/usr/bin/env python3
"""Write the settings table's keywords into the Python signatures that take them.

The C settings table (``_core.settings()``) is the one account of every setting of the
order, the engine and the device stage: name, type, default, bounds. ``Loader`` and
``tokenfeed.torch.TokenDataset`` take those settings as keywords; so that ``inspect``,
IDEs and mypy see every one, with its type and default, the keywords are written out in
the source between two marker lines, from the table:

    python tests/gen_signatures.py           # rewrite the blocks from the table
    python tests/gen_signatures.py --check   # exit 1 if a block differs (tests/project/test_signatures.py)

A row the table marks nullable is ``Optional[...] = None`` (None: the row's default);
any other row has its default written out (an enum by its name). The function body
passes on every keyword whose value is not that default (``settings_given``).
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# which rows each signature writes out: (file, marker, module whose <names> lists them)
TARGETS: Sequence[Tuple[str, str, str, str]] = (
    ("python/tokenfeed/engine/_loader.py", "Loader", "tokenfeed.engine._loader", "LOADER_SETTINGS"),
    ("python/tokenfeed/torch.py", "TokenDataset", "tokenfeed.torch", "TOKEN_DATASET_SETTINGS"),
)
INDENT = " " * 17
WIDTH = 118


def begin(marker: str) -> str:
    return f"{INDENT}# BEGIN settings keywords of {marker} (tests/gen_signatures.py writes this block)"


def end(marker: str) -> str:
    return f"{INDENT}# END settings keywords of {marker}"


def param(row: Dict) -> str:
    """One keyword-only parameter for a row of the settings table."""
    from tokenfeed.order._config import keyword_default

    name, typ = row["name"], row["type"]
    ann = {"enum": "Literal[" + ", ".join(lit(n) for n in row["names"] or ()) + "]", "bool": "bool",
           "path": "str"}.get(typ, "int")
    if row["nullable"]:
        ann = f"Optional[{ann}]"
    return f"{name}: {ann} = {lit(keyword_default(row))}"


def lit(v: object) -> str:
    """A Python literal in the project's style (strings in double quotes)."""
    return f'"{v}"' if isinstance(v, str) else repr(v)


def block(rows: Sequence[Dict], marker: str, names: Sequence[str]) -> List[str]:
    by_name = {r["name"]: r for r in rows}
    params = [param(by_name[n]) for n in names]
    lines, cur = [], INDENT
    for p in params:
        piece = p + ","
        if cur.strip() and len(cur) + 1 + len(piece) > WIDTH:
            lines.append(cur.rstrip())
            cur = INDENT
        cur += (" " if cur.strip() else "") + piece
    if cur.strip():
        lines.append(cur.rstrip())
    return [begin(marker)] + lines + [end(marker)]


def rewrite(text: str, new_block: List[str], marker: str) -> str:
    lines = text.split("\n")
    try:
        a = lines.index(begin(marker))
        b = lines.index(end(marker))
    except ValueError:
        raise SystemExit(f"gen_signatures: the marker lines of {marker} are missing") from None
    return "\n".join(lines[:a] + new_block + lines[b + 1:])


def main(argv: Sequence[str]) -> int:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from tokenfeed import _core

    import importlib

    rows = _core.settings()
    check = "--check" in argv
    stale = []
    for path, marker, module, names in TARGETS:
        full = os.path.join(ROOT, path)
        with open(full) as f:
            text = f.read()
        new = rewrite(text, block(rows, marker, getattr(importlib.import_module(module), names)), marker)
        if new != text:
            stale.append(path)
            if not check:
                with open(full, "w") as f:
                    f.write(new)
    if check and stale:
        print("the settings keywords written in " + ", ".join(stale) + " differ from the settings table: "
              "run python tests/gen_signatures.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
