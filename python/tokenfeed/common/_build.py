"""What this build of the C core has, and how to get what it lacks.

The build records one line (``build_info()["build"]``), written by csrc/Makefile
from the probe of csrc/configure.sh and compiled into the extension, e.g.::

    zstd: found (pkg-config); io_uring: not found: install liburing-dev (Debian/Ubuntu)
    or liburing-devel (Fedora/RHEL), then rebuild; test hooks: off

A build from source that did not find an optional library says so at import, in
one warning line: ``pip install`` hides the build's own output unless run with
``-v``, so that line is the first place a user can see it. A library left out on
purpose (``TOKENFEED_NO_ZSTD=1``) gives no warning.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, List

from .. import _core

OPTIONAL = ("zstd", "io_uring")
WHAT_FOR = {
    "zstd": "zstd-compressed datasets cannot be read or written",
    "io_uring": "backend='io_uring' falls back to pread",
}
REINSTALL = ("then reinstall tokenfeed without pip's cache (pip install --force-reinstall --no-cache-dir tokenfeed, "
             "or pip install . in a clone)")


def parse_summary(summary: str) -> Dict[str, str]:
    """``"zstd: found (pkg-config); test hooks: on"`` -> ``{"zstd": "found (pkg-config)", "test hooks": "on"}``."""
    out: Dict[str, str] = {}
    for part in summary.split("; "):
        key, sep, value = part.partition(": ")
        if sep:
            out[key.strip()] = value.strip()
    return out


def feature_detail(name: str, status: str) -> str:
    """Why an optional library is not in this build (``status`` is its entry in the build line), and how to get it."""
    if status.startswith("disabled by "):
        setting = status[len("disabled by "):]
        return f"left out on purpose ({setting} at build time); rebuild without {setting.split('=')[0]} to get it"
    if status.startswith("not found"):
        install = status.partition(": ")[2].replace(", then rebuild", "") or "install its development package"
        return f"not found when tokenfeed was built: {install}, {REINSTALL}"
    return f"not compiled in ({status or 'the build did not record why'})"


def missing(summary: str, compiled: Dict[str, bool]) -> List[str]:
    """One line per optional library the build looked for and did not find (not those left out on purpose)."""
    probe = parse_summary(summary)
    out = []
    for name in OPTIONAL:
        status = probe.get(name, "")
        if not compiled[name] and status.startswith("not found"):
            out.append(f"tokenfeed was built without {name} ({WHAT_FOR[name]}): {feature_detail(name, status)}. "
                       f"To leave it out on purpose and silence this, build with TOKENFEED_NO_{name.upper()}=1.")
    return out


def build_info() -> Dict[str, Any]:
    info: Dict[str, Any] = dict(_core.build_info())
    probe = parse_summary(str(info.get("build", "")))
    for name in OPTIONAL:
        feat = dict(info[name])
        if not feat["compiled"]:
            feat["detail"] = feature_detail(name, probe.get(name, ""))
        else:
            feat.setdefault("detail", "compiled in")
        info[name] = feat
    info["test_hooks"] = probe.get("test hooks") == "on"
    info["sanitizers"] = probe.get("sanitizers", "")
    return info


def warn_if_missing() -> None:
    """At import: one warning per optional library that the build did not find."""
    info = _core.build_info()
    for line in missing(str(info.get("build", "")), {n: bool(info[n]["compiled"]) for n in OPTIONAL}):
        warnings.warn(line, UserWarning, stacklevel=3)


def report() -> str:
    """The text of ``tokenfeed build-info``: what is in this build, what is usable here, and how to get the rest."""
    info = build_info()
    lines = [f"tokenfeed {info['version']}"]
    for name in ("zstd", "io_uring", "cuda"):
        f = info[name]
        state = "usable" if f["usable"] else ("compiled in, not usable here" if f["compiled"] else "not in this build")
        detail = f.get("detail", "")
        lines.append(f"  {name:<10} {state}" + (f": {detail}" if detail and detail not in ("usable", "compiled in")
                                                  else ""))
    lines.append(f"  {'test hooks':<10} {'on (a test build)' if info['test_hooks'] else 'off'}")
    if info["sanitizers"]:
        lines.append(f"  {'sanitizers':<10} {info['sanitizers']}")
    lines.append(f"  build      {info['build']}")
    return "\n".join(lines)
