"""``--install-peers``: one virtual environment per peer, installed with a time limit.

Why one environment per peer: peers pin conflicting versions of shared packages
(MosaicML Streaming 0.13 needs ``numpy<2.2`` and ``transformers<5``, whose version check
needs ``huggingface-hub<1``, while ``datasets`` 5 needs ``huggingface-hub`` 2), so a
shared environment makes every peer hostage to the strictest one, and a resolver
searching for a common set (with every installed package pinned) ran for many minutes.
Alone, each peer resolves in seconds.

What goes in: the peer's pinned release and numpy, with torch pinned to the version the
benchmark itself runs with, so no install ever pulls a different (possibly multi-GB
CUDA) build. torch is unpacked once, into ``<root>/base`` (with a current pip, which
also installs into the peer environments through ``pip --python``); each peer
environment sees it through a ``.pth`` file placed after its own site-packages. The
environments do not see the user's site-packages; the benchmark's own package reaches
them through a directory holding a single link (``shim/tokenfeed_bench``) on
``PYTHONPATH``, and peers never import tokenfeed.

Every command runs in its own process group with a deadline: pip's output is shown as
it goes, a silent stretch prints what pip last said, and a peer that has not finished
by ``--install-timeout`` is stopped and reported with pip's last lines instead of
holding up the run.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .peers import Peer

READY = "tokenfeed-bench-ready.json"


def torch_requirement() -> Optional[str]:
    """``torch==X.Y.Z`` for the torch this interpreter has (local label such as +cpu dropped), or None."""
    import importlib.metadata as md

    try:
        v = md.version("torch")
    except Exception:
        return None
    return "torch==" + v.split("+", 1)[0]


def run_bounded(cmd: Sequence[str], deadline: float, log: Callable[[str], None], prefix: str,
                env: Optional[Dict[str, str]] = None, quiet_lines: Sequence[str] = (),
                heartbeat: float = 15.0) -> Dict[str, Any]:
    """Run cmd until it exits or the monotonic deadline passes; show its output as it comes.

    Returns {"rc", "timed_out", "seconds", "tail"} (tail: last output lines). On the
    deadline the whole process group gets SIGTERM, then SIGKILL 5 s later.
    """
    t0 = time.monotonic()
    tail: List[str] = []
    try:
        p = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             text=True, errors="replace", env=env, start_new_session=True)
    except OSError as e:
        return {"rc": None, "timed_out": False, "seconds": 0.0, "tail": [f"could not run {cmd[0]}: {e}"]}
    q: "queue.Queue[Optional[str]]" = queue.Queue()

    def pump() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            q.put(line.rstrip())
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    last_shown = time.monotonic()
    timed_out = False
    eof = False
    while not eof:
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        try:
            line: Optional[str] = q.get(timeout=min(1.0, max(0.01, deadline - now)))
        except queue.Empty:
            line = ""
        if line is None:
            eof = True
            break
        if line.strip():
            tail = (tail + [line])[-12:]
            if not line.lstrip().startswith(tuple(quiet_lines)):
                log(f"{prefix}{line[:200]}")
                last_shown = time.monotonic()
        if time.monotonic() - last_shown >= heartbeat:
            last = tail[-1].strip() if tail else "(no output yet)"
            log(f"{prefix}still running after {time.monotonic() - t0:.0f}s; last: {last[:160]}")
            last_shown = time.monotonic()
    if timed_out:
        _kill_group(p)
    rc = p.wait()
    return {"rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 1), "tail": tail}


def _kill_group(p: "subprocess.Popen[str]") -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def dir_size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            total += st.st_blocks * 512
    return total


def shim_dir(root: str) -> str:
    """A directory holding only a link to this package: the PYTHONPATH of peer children."""
    d = os.path.join(root, "shim")
    os.makedirs(d, exist_ok=True)
    link = os.path.join(d, "tokenfeed_bench")
    target = os.path.dirname(os.path.abspath(__file__))
    if os.path.islink(link) and os.readlink(link) == target:
        return d
    tmp = link + f".tmp{os.getpid()}"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)
    return d


def venv_python(root: str, peer: Peer) -> str:
    return os.path.join(root, peer.key, "bin", "python")


def _applies(requirement: str) -> bool:
    """Whether a requirement's environment marker holds for this interpreter (python_version
    markers only: the only kind peers.py uses)."""
    if ";" not in requirement:
        return True
    marker = requirement.split(";", 1)[1].strip()
    try:
        from packaging.markers import Marker

        return bool(Marker(marker).evaluate())
    except ImportError:
        import operator
        import re

        m = re.fullmatch(r"python_version\s*(<=|>=|<|>|==|!=)\s*[\"']([\d.]+)[\"']", marker)
        if not m:
            return True
        ops = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
               "!=": operator.ne}
        want = tuple(int(x) for x in m.group(2).split("."))
        return bool(ops[m.group(1)](sys.version_info[:len(want)], want))


def install_hint(peer: Peer) -> str:
    """A pip command for this interpreter that installs the peer's pinned release as it is."""
    import shlex

    reqs = [r.split(";", 1)[0].strip() for r in peer.requirements if _applies(r)]
    return f"{shlex.quote(sys.executable)} -m pip install " + " ".join(shlex.quote(r) for r in reqs)


def requirements_for(peer: Peer) -> List[str]:
    reqs = list(peer.requirements) + ["numpy"]  # every loader module reads the tokens with numpy
    if peer.needs_torch:
        t = torch_requirement()
        if t:
            reqs.append(t)
    return reqs


def check_import(python: str, peer: Peer, timeout: float = 120.0, pythonpath: Optional[str] = None) -> Dict[str, Any]:
    """Import the peer in its interpreter; return {"ok", "versions" or "reason"}."""
    dists = sorted({r.split(";")[0].split("=")[0].split(">")[0].split("<")[0].strip() for r in peer.requirements})
    dists += ["torch", "numpy"]
    code = ("import importlib, importlib.metadata as md, json\n"
            f"m = importlib.import_module('tokenfeed_bench.loaders.{peer.loader}')\n"
            f"m.check() if hasattr(m, 'check') else importlib.import_module({peer.imports!r})\n"
            "v = {}\n"
            f"for d in {dists!r}:\n"
            "    try: v[d] = md.version(d)\n"
            "    except Exception: pass\n"
            "print('@@V@@' + json.dumps(v))\n")
    env = dict(os.environ, PYTHONNOUSERSITE="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "reason": f"import {peer.imports} did not finish in {timeout:.0f}s"}
    except OSError as e:
        return {"ok": False, "reason": f"could not run {python}: {e}"}
    k = p.stdout.rfind("@@V@@")
    if p.returncode != 0 or k < 0:
        err = [x for x in p.stderr.strip().splitlines() if x.strip()]
        return {"ok": False, "reason": f"import {peer.imports} failed: {' | '.join(err[-2:])[:400]}"}
    return {"ok": True, "versions": json.loads(p.stdout[k + 5:].strip().splitlines()[0])}


def _site_packages(env_dir: str) -> str:
    v = sys.version_info
    return os.path.join(env_dir, "lib", f"python{v.major}.{v.minor}", "site-packages")


_QUIET = ("Requirement already satisfied", "Using cached", "Looking in indexes", "Looking in links",
          "WARNING: Location", "Obtaining", "Preparing metadata", "Getting requirements", "Installing build",
          "Attempting uninstall", "Found existing installation", "Uninstalling", "Successfully uninstalled")


def _pip_env() -> Dict[str, str]:
    return dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1", PIP_NO_INPUT="1")


def ensure_base(root: str, *, deadline: float, log: Callable[[str], None],
                python: str = sys.executable) -> Dict[str, Any]:
    """<root>/base: a current pip and the pinned torch, shared by every peer environment.

    Peers see its site-packages through a .pth file placed after their own, so torch is
    installed (and unpacked, about 1 GB) once instead of once per peer; a peer that
    needs another version of a shared package gets it in its own environment, in front.
    """
    env_dir = os.path.join(root, "base")
    py = os.path.join(env_dir, "bin", "python")
    torch_req = torch_requirement()
    want = {"torch": torch_req, "v": 1}
    stamp = os.path.join(env_dir, READY)
    if os.path.exists(stamp) and os.path.exists(py):
        try:
            with open(stamp) as f:
                if json.load(f).get("want") == want:
                    return {"status": "ok", "python": py, "reused": True}
        except (OSError, ValueError):
            pass
    t0 = time.monotonic()
    prefix = "  base: "
    log(f"preparing the shared peer base {env_dir}: current pip" + (f", {torch_req}" if torch_req else ""))
    shutil.rmtree(env_dir, ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    r = run_bounded([python, "-m", "venv", env_dir], deadline, log, prefix)
    if r["timed_out"] or r["rc"] != 0 or not os.path.exists(py):
        return {"status": "failed", "reason": f"could not create {env_dir}: {' | '.join(r['tail'][-2:])}"}
    cmd = [py, "-m", "pip", "install", "--progress-bar", "off", "--upgrade", "pip"] + ([torch_req] if torch_req else [])
    r = run_bounded(cmd, deadline, log, prefix, env=_pip_env(), quiet_lines=_QUIET)
    if r["timed_out"] or r["rc"] != 0:
        why = "did not finish in time (raise --install-timeout)" if r["timed_out"] else f"failed (exit {r['rc']})"
        return {"status": "timed out" if r["timed_out"] else "failed",
                "reason": f"{' '.join(cmd[3:])} {why}: {' | '.join(r['tail'][-2:])[:400]}"}
    os.makedirs(env_dir, exist_ok=True)
    with open(stamp, "w") as f:
        json.dump({"want": want, "size_bytes": dir_size(env_dir)}, f)
    log(f"{prefix}ready in {time.monotonic() - t0:.0f}s ({dir_size(env_dir) / 2**30:.2f} GiB)")
    return {"status": "ok", "python": py, "reused": False, "seconds": round(time.monotonic() - t0, 1)}


def ensure_peer(peer: Peer, root: str, *, timeout: float, log: Callable[[str], None],
                python: str = sys.executable, pip_install: Optional[List[str]] = None,
                reuse: bool = True) -> Dict[str, Any]:
    """Make <root>/<peer.key> a virtual environment where the peer imports, within `timeout` seconds.

    Returns {"status": "ok"|"failed"|"timed out", "python", "versions", "reason", "seconds",
    "size_bytes", "reused"}. `pip_install` replaces the pip command (tests use a local
    stand-in); then no shared base is made.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    env_dir = os.path.join(root, peer.key)
    py = venv_python(root, peer)
    reqs = requirements_for(peer)
    if peer.needs_torch and not any(r.startswith("torch==") for r in reqs):
        return {"status": "failed", "reason": "torch is not installed here: peers run on the benchmark's own "
                                              "torch version (pip install torch, then rerun)", "seconds": 0.0}
    stamp = os.path.join(env_dir, READY)
    if reuse and os.path.exists(stamp) and os.path.exists(py):
        try:
            with open(stamp) as f:
                ready = json.load(f)
        except (OSError, ValueError):
            ready = {}
        if ready.get("requirements") == reqs:
            return {"status": "ok", "python": py, "versions": ready.get("versions", {}), "reused": True,
                    "seconds": round(time.monotonic() - t0, 1), "size_bytes": ready.get("size_bytes"),
                    "requirements": reqs}
    prefix = f"  {peer.key}: "
    steps: Dict[str, Any] = {}

    def fail(status: str, reason: str) -> Dict[str, Any]:
        log(f"{prefix}{status}: {reason}")
        return {"status": status, "reason": reason, "python": py, "seconds": round(time.monotonic() - t0, 1),
                "requirements": reqs, "steps": steps}

    if pip_install is None:
        # the shared base has a limit of its own: the first peer's install should not pay for it
        base = ensure_base(root, deadline=time.monotonic() + timeout, log=log, python=python)
        steps["base"] = base.get("seconds", 0.0)
        if base["status"] != "ok":
            return fail(base["status"], "shared base: " + base["reason"])
        t0 = time.monotonic()
        deadline = t0 + timeout
        cmd = [base["python"], "-m", "pip", "--python", py, "install", "--progress-bar", "off"]
    else:
        cmd = list(pip_install)
    log(f"installing {peer.key} into {env_dir} (limit {timeout:.0f}s): {' '.join(reqs)}")
    shutil.rmtree(env_dir, ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    r = run_bounded([python, "-m", "venv", "--without-pip", env_dir], deadline, log, prefix)
    steps["venv"] = r["seconds"]
    if r["timed_out"] or r["rc"] != 0 or not os.path.exists(py):
        why = "timed out" if r["timed_out"] else f"exit {r['rc']}"
        return fail("failed", f"could not create a virtual environment ({why}): {' | '.join(r['tail'][-2:])}")
    if pip_install is None and peer.needs_torch:
        with open(os.path.join(_site_packages(env_dir), "_tokenfeed_bench_base.pth"), "w") as f:
            f.write(_site_packages(os.path.join(root, "base")) + "\n")
    r = run_bounded(cmd + reqs, deadline, log, prefix, env=_pip_env(), quiet_lines=_QUIET)
    steps["pip_install"] = r["seconds"]
    lines = [x for x in r["tail"] if not x.lstrip().startswith(_QUIET)]
    if r["timed_out"]:
        return fail("timed out", f"pip install {' '.join(reqs)} did not finish in {timeout:.0f}s (raise "
                                 f"--install-timeout); pip's last words: {' | '.join(lines[-2:])[:400]}")
    if r["rc"] != 0:
        err = [x for x in lines if ("ERROR" in x or "error" in x) and "Ignored the following" not in x] or lines
        return fail("failed", f"pip install {' '.join(reqs)} failed (exit {r['rc']}): {' | '.join(err[-3:])[:500]}")
    chk = check_import(py, peer, timeout=max(5.0, min(120.0, deadline - time.monotonic())),
                       pythonpath=shim_dir(root))
    if not chk["ok"]:
        return fail("failed", chk["reason"])
    size = dir_size(env_dir)
    ready = {"requirements": reqs, "versions": chk["versions"], "size_bytes": size,
             "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with open(stamp, "w") as f:
        json.dump(ready, f, indent=1)
    secs = round(time.monotonic() - t0, 1)
    log(f"{prefix}ready in {secs}s ({size / 2**20:.0f} MiB of its own): "
        + ", ".join(f"{k} {v}" for k, v in chk["versions"].items()))
    return {"status": "ok", "python": py, "versions": chk["versions"], "reused": False, "seconds": secs,
            "size_bytes": size, "requirements": reqs, "steps": steps}


def find_installed(peer: Peer, root: str) -> Optional[str]:
    """The interpreter of an environment an earlier --install-peers run left ready, if any."""
    py = venv_python(root, peer)
    if os.path.exists(os.path.join(root, peer.key, READY)) and os.path.exists(py):
        return py
    return None
