"""Type checking: the package and a typed user program pass ``mypy --strict``.

The stub of the extension (``tokenfeed/_core.pyi``) is also compared with the built
module, name by name, so a method added or renamed in C cannot silently go missing
from the stub. mypy is in the ``test`` extra; the check passes with and without the
optional packages installed.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import pytest

import tokenfeed
from tokenfeed import _core

pytest.importorskip("mypy")

PKG = os.path.dirname(os.path.abspath(tokenfeed.__file__))
# The typed surface: every module of the package, subpackages (integrations/) included.
MODULES = sorted(os.path.relpath(os.path.join(d, f), PKG) for d, _, fs in os.walk(PKG) for f in fs
                 if f.endswith((".py", ".pyi")) and "__pycache__" not in d and ".mypy_cache" not in d)
# The project's mypy settings (the optional packages); the sanitizer run mirrors the repository's layout.
PYPROJECT = os.path.join(os.path.dirname(os.path.dirname(PKG)), "pyproject.toml")

USAGE = '''
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import numpy.typing as npt

import tokenfeed


def count_tokens(path: str) -> int:
    ds: tokenfeed.Dataset = tokenfeed.open(path)
    first: npt.NDArray[Any] = ds.document(0)
    span: npt.NDArray[Any] = ds.tokens(0, min(10, ds.num_tokens))
    files: List[Dict[str, Any]] = ds.files()
    vocab: Optional[int] = ds.vocab_size
    fp: str = ds.fingerprint
    ds.verify(threads=2, progress=False)
    return ds.num_tokens + len(first) + len(span) + len(files) + (vocab or 0) + len(fp)


def write(path: str) -> None:
    with tokenfeed.DatasetWriter(path, vocab_size=50257, compression="zstd", level=3) as w:
        w.add_document(np.arange(10, dtype=np.uint16))
        w.add_document([1, 2, 3])
    n: int = w.num_tokens


def train(path: str) -> Dict[str, Any]:
    loader = tokenfeed.Loader(path, seq_len=128, batch_size=4, seed=0, output="numpy")
    for step, batch in enumerate(loader):
        x = batch["input_ids"]
        if step == 2:
            break
    state: Dict[str, Any] = loader.state_dict()
    loader.load_state_dict(state)
    loader.close()
    return state


def mixture(web: tokenfeed.Dataset, code: tokenfeed.Dataset) -> Optional[tokenfeed.WeightSchedule]:
    phases = tokenfeed.WeightSchedule([(0, [0.7, 0.3]), (1000, [0.4, 0.6])], interpolation="linear")
    share: List[float] = phases.proportions_at(500)
    again: tokenfeed.WeightSchedule = tokenfeed.WeightSchedule.from_dict(phases.to_dict())
    loader = tokenfeed.Loader([web, code], weights=again, seq_len=128, batch_size=4, packing="best_fit",
                              mix_window=100)
    plain = tokenfeed.Loader([web, code], weights=[0.5, 0.5], seq_len=128, batch_size=4)
    per_source: Dict[str, Any] = loader.stats()
    w: Optional[List[float]] = plain.weights
    return loader.weight_schedule if share and per_source and w else None


def parallel(path: str) -> int:
    pc: tokenfeed.ParallelCoords = tokenfeed.parallel_coords(dp_rank=1, dp_size=2, cp_rank=0, cp_size=2)
    loader = tokenfeed.Loader(path, seq_len=128, batch_size=4, dp_rank=pc.dp_rank, dp_size=pc.dp_size,
                              cp_rank=pc.cp_rank, cp_size=pc.cp_size, position_ids=True, loss_mask=True,
                              device="cuda", device_prefetch_batches=2, device_slots=4)
    coords: tokenfeed.ParallelCoords = loader.parallel
    return loader.cp_size * loader.dp_size + loader.global_batch + coords.dp_rank


def parts(path: str, k: int, n: int) -> tokenfeed.Dataset:
    with tokenfeed.PartWriter(path, part=k, parts=n, vocab_size=1000, metadata={"eod": 0}) as w:
        w.add_documents([[1, 2], np.arange(3, dtype=np.uint16)])
    written: int = w.num_documents + w.num_tokens
    return tokenfeed.merge_parts(path, overwrite=written > 0)


def remote(url: str) -> Optional[Dict[str, Any]]:
    ds = tokenfeed.open(url, cache_dir="/tmp/tokenfeed-cache", cache_limit="200GB",
                        endpoint_url="http://127.0.0.1:9000", chunk_size=8 << 20, prefetch_bytes="1GiB",
                        fetch_threads=8, request_timeout=30.0, storage_options={"region": "us-east-1"})
    return ds.cache_stats()


def on_gpu(host_batch: Dict[str, Any]) -> bool:
    feeder = tokenfeed.DeviceFeeder("cuda:0", output="dlpack", slots=4)
    batch: Dict[str, Any] = feeder(host_batch)
    feeder.close()
    return isinstance(batch["tokens"], tokenfeed.DeviceTensor)


def strict_performance() -> None:
    import warnings

    warnings.simplefilter("error", tokenfeed.PerformanceWarning)


def info() -> bool:
    b: Dict[str, Any] = tokenfeed.build_info()
    inc: str = tokenfeed.get_include()
    lib: str = tokenfeed.get_library()
    try:
        tokenfeed.open("missing")
    except tokenfeed.FormatError as e:
        return bool(str(e))
    return bool(b) and bool(inc) and bool(lib)
'''


_CACHE: list[str] = []


def run_mypy(*args: str) -> subprocess.CompletedProcess[str]:
    if not _CACHE:  # one cache per test session: numpy's stubs are analysed once, not per run
        import tempfile

        _CACHE.append(tempfile.mkdtemp(prefix="tokenfeed-mypy-"))
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--config-file", PYPROJECT,
                           "--cache-dir", _CACHE[0], "--show-error-codes",
                           "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}", *args],
                          capture_output=True, text=True, cwd=os.path.dirname(PKG))


def test_package_passes_mypy_strict():
    paths = [os.path.join("tokenfeed", m) for m in MODULES if os.path.exists(os.path.join(PKG, m))]
    p = run_mypy(*paths)
    assert p.returncode == 0, p.stdout + p.stderr


def test_package_passes_mypy_strict_without_optional_packages(tmp_path):
    """The same check where only numpy, the one required dependency, is installed: an optional
    import (torch, pyarrow, tokenizers, ...) must not fail it. mypy looks for installed packages
    through an interpreter (a bare virtual environment) whose path holds numpy alone."""
    import numpy

    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    only_numpy = tmp_path / "only-numpy"
    only_numpy.mkdir()
    os.symlink(os.path.dirname(numpy.__file__), only_numpy / "numpy")
    for site in venv.glob("lib/python*/site-packages"):
        (site / "only_numpy.pth").write_text(f"{only_numpy}\n")
    bare_python = str(venv / "bin" / "python")
    probe = subprocess.run([bare_python, "-c", "import importlib.util as u; print(u.find_spec('numpy') is not None, "
                            "u.find_spec('torch') is None and u.find_spec('pyarrow') is None)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["True", "True"], probe.stdout + probe.stderr
    # tokenfeed.torch is the torch adapter itself: it needs torch to mean anything
    paths = [os.path.join("tokenfeed", m) for m in MODULES if os.path.exists(os.path.join(PKG, m)) and m != "torch.py"]
    p = run_mypy("--python-executable", bare_python, *paths)
    assert p.returncode == 0, p.stdout + p.stderr


def test_typed_usage_passes_mypy_strict(tmp_path):
    snippet = tmp_path / "usage.py"
    snippet.write_text(textwrap.dedent(USAGE))
    p = run_mypy(str(snippet))
    assert p.returncode == 0, p.stdout + p.stderr


def test_typed_usage_errors_are_caught(tmp_path):
    """The stubs are not Any all the way down: a wrong call is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import tokenfeed\nds = tokenfeed.open('x')\nn: str = ds.num_tokens\n"
                   "tokenfeed.DatasetWriter('x')\n")
    p = run_mypy(str(bad))
    assert p.returncode != 0
    assert "num_tokens" in p.stdout or "Incompatible types" in p.stdout
    assert "vocab_size" in p.stdout


def test_py_typed_ships():
    assert os.path.exists(os.path.join(PKG, "py.typed"))
    assert os.path.exists(os.path.join(PKG, "_core.pyi"))
    with open(os.path.join(os.path.dirname(os.path.dirname(PKG)), "pyproject.toml")) as f:
        text = f.read()
    assert '"py.typed"' in text and '"*.pyi"' in text


def test_all_names_the_public_api():
    """``tokenfeed.__all__`` lists what exists, and every public class or function of the
    package reachable as ``tokenfeed.X`` is in it (typing helpers imported for annotations are not)."""
    missing = [n for n in tokenfeed.__all__ if not hasattr(tokenfeed, n)]
    assert not missing
    defined_here = {n for n in dir(tokenfeed) if not n.startswith("_")
                    and getattr(getattr(tokenfeed, n), "__module__", "").startswith("tokenfeed")}
    assert defined_here - set(tokenfeed.__all__) == set()
    for name in ("WeightSchedule", "parallel_coords", "ParallelCoords", "PerformanceWarning", "PartWriter",
                 "merge_parts"):
        assert name in tokenfeed.__all__


def _stub_names() -> dict[str, set[str]]:
    with open(os.path.join(PKG, "_core.pyi")) as f:
        tree = ast.parse(f.read())
    out: dict[str, set[str]] = {"": set()}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[""].add(node.name)
            out[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.FunctionDef):
            out[""].add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[""].add(node.target.id)
    return out


def test_stub_matches_extension_module():
    stub = _stub_names()
    runtime = {n for n in dir(_core) if not n.startswith("_") or n == "__version__"}
    stub_public = {n for n in stub[""] if not n.startswith("_") or n == "__version__"}
    assert runtime - stub_public == set(), "names in tokenfeed._core missing from _core.pyi"
    assert stub_public - runtime == set(), "names in _core.pyi that tokenfeed._core lacks"
    for cls in sorted(n for n in stub[""] if n in stub and isinstance(getattr(_core, n, None), type)
                      and not issubclass(getattr(_core, n), BaseException)):
        rt = {n for n in dir(getattr(_core, cls)) if not n.startswith("_")}
        st = {n for n in stub[cls] if not n.startswith("_")}
        assert rt - st == set(), f"_core.{cls} members missing from the stub"
        assert st - rt == set(), f"_core.pyi {cls} members the extension lacks"
