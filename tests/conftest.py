"""Shared fixtures (generated token data: nothing is downloaded) and the skip rule.

The skip rule
=============

A test that skips has not shown anything, so under ``CI=true`` (as ``.ci/run``
runs) a skip FAILS the run, with a message that says what to fix. Exactly two
kinds of skip are allowed there:

1. **No GPU.** A test marked ``@pytest.mark.gpu`` is skipped by this file, with
   the reason ``GPU_SKIP_REASON``, when torch is importable and
   ``torch.cuda.is_available()`` is False. Only that skip is allowed: the same
   test skipped for another reason (torch missing, say) fails.
2. **An explicitly optional module.** ``pytest.importorskip("ray")`` may skip
   under CI only if the top-level module is a key of ``OPTIONAL_MODULES`` below.
   A module belongs there only when it is deliberately NOT in the ``test``
   extra (too large, or another platform's), and its value says why and how to
   install it. Everything else a test imports goes into
   ``[project.optional-dependencies] test`` in pyproject.toml.

   To add an optional dependency's tests: import it with
   ``pytest.importorskip("name")`` (module level or in the test), then add
   ``"name": "why it is optional; pip install ..."`` to ``OPTIONAL_MODULES``.

Any other skip under CI fails: ``pytest.skip(...)``, ``skipif`` markers, a test
marked ``test_hooks`` in a build without them, a missing C compiler. Outside CI
every skip is reported as usual (``-ra`` lists them). xfail is not a skip.

Also under CI, the session refuses to start unless the build under test has
what the suite exercises: zstd and io_uring usable, and the test hooks compiled
in (``ci_build_problems``); otherwise tests parametrised over the backends that
are usable would quietly test less.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import pytest

import tokenfeed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")

# Top-level module -> why it is not in the `test` extra and how to install it.
# Under CI, a skip from pytest.importorskip of one of these is allowed.
OPTIONAL_MODULES: Dict[str, str] = {
    "ray": "datatrove's Ray executor; heavy (hundreds of MB) and not needed by tokenfeed itself: pip install ray",
}

GPU_SKIP_REASON = "needs a CUDA GPU: torch.cuda.is_available() is False"
HOOKS_SKIP_REASON = ("needs the fault-injection hooks of a test build (build_info()['test_hooks'] is False): "
                     "reinstall with TOKENFEED_TEST_HOOKS=1, as tests/run.sh does")
_IMPORT_SKIP = re.compile(r"could not import '([A-Za-z_][\w.]*)'")


def skip_verdict(reason: str, gpu_marked: bool) -> Optional[str]:
    """None if a skip with this reason is allowed under CI, else why it is not (the failure message)."""
    if gpu_marked and reason == GPU_SKIP_REASON:
        return None
    m = _IMPORT_SKIP.search(reason)
    if m:
        module = m.group(1)
        if module.split(".")[0] in OPTIONAL_MODULES:
            return None
        return (f"skipped because the Python module {module!r} is missing, and CI=true allows no such skip: add "
                f"the distribution that provides it to [project.optional-dependencies] test in pyproject.toml "
                f"(or, for a deliberately optional dependency, to OPTIONAL_MODULES in tests/conftest.py). "
                f"Skip reason: {reason}")
    return f"skipped, and CI=true allows no skip but a missing GPU (see tests/conftest.py). Skip reason: {reason}"


def ci_build_problems(info: Dict[str, Any]) -> List[str]:
    """What the build under test lacks for a complete CI run (empty when nothing)."""
    out = []
    for name in ("zstd", "io_uring"):
        if not info[name]["usable"]:
            out.append(f"{name} is not usable: {info[name].get('detail', '')}")
    if not info.get("test_hooks"):
        out.append("the test hooks are not compiled in (build with TOKENFEED_TEST_HOOKS=1, as tests/run.sh does)")
    return out


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (and torch); skipped without one, the only skip "
                                       "CI allows besides OPTIONAL_MODULES")
    config.addinivalue_line("markers", "test_hooks: needs a test build with the fault-injection hooks "
                                       "(TOKENFEED_TEST_HOOKS=1)")


def pytest_sessionstart(session: pytest.Session) -> None:
    if CI:
        problems = ci_build_problems(tokenfeed.build_info())
        if problems:
            raise pytest.UsageError("CI=true needs a complete test build of tokenfeed; this one has problems:\n  "
                                    + "\n  ".join(problems))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None:
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip(GPU_SKIP_REASON)
    if item.get_closest_marker("test_hooks") is not None and not tokenfeed.build_info()["test_hooks"]:
        pytest.skip(HOOKS_SKIP_REASON)


def _skip_reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    rep = outcome.get_result()
    if CI and rep.skipped and not hasattr(rep, "wasxfail"):
        why = skip_verdict(_skip_reason(rep.longrepr), item.get_closest_marker("gpu") is not None)
        if why is not None:
            rep.outcome = "failed"
            rep.longrepr = f"{item.nodeid}: {why}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """A whole module skipped at import (module-level importorskip) falls under the same rule."""
    outcome = yield
    rep = outcome.get_result()
    if CI and rep.skipped:
        why = skip_verdict(_skip_reason(rep.longrepr), False)
        if why is not None:
            rep.outcome = "failed"
            rep.longrepr = f"{collector.nodeid}: {why}"


def random_docs(rng: np.random.Generator, n_docs: int, vocab: int, mean_len: float = 200.0,
                empty_frac: float = 0.0) -> List[np.ndarray]:
    """Documents with log-normal lengths (heavy-tailed, like real corpora)."""
    lens = np.maximum(1, rng.lognormal(np.log(mean_len), 1.0, size=n_docs).astype(np.int64))
    if empty_frac:
        lens[rng.random(n_docs) < empty_frac] = 0
    return [rng.integers(0, vocab, size=int(n), dtype=np.int64) for n in lens]


@pytest.fixture
def make_dataset(tmp_path) -> Callable[..., tokenfeed.Dataset]:
    """make_dataset(n_docs=..., vocab=..., shard_tokens=..., seed=..., **writer_kw) -> Dataset."""
    counter = [0]

    def make(n_docs: int = 300, vocab: int = 50257, shard_tokens: int = 1 << 28, seed: int = 0,
             mean_len: float = 200.0, docs=None, **kw) -> tokenfeed.Dataset:
        counter[0] += 1
        path = tmp_path / f"ds{counter[0]}"
        if docs is None:
            docs = random_docs(np.random.default_rng(seed), n_docs, vocab, mean_len)
        with tokenfeed.DatasetWriter(path, vocab_size=vocab, shard_tokens=shard_tokens, **kw) as w:
            for d in docs:
                w.add_document(d)
        ds = tokenfeed.open(path)
        ds._test_docs = docs  # type: ignore[attr-defined]
        return ds

    return make


def torch_or_skip():
    return pytest.importorskip("torch")
