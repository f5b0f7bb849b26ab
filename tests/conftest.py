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
2. **An explicitly optional module.** ``pytest.importorskip(module)`` may skip
   under CI only if the top-level module is a key of ``OPTIONAL_MODULES`` below
   (none at present: every module the tests import is in the ``test`` extra).
   A module belongs there only when it is deliberately NOT in the ``test``
   extra (too large, or another platform's), and its value says why and how to
   install it. Everything else a test imports goes into
   ``[project.optional-dependencies] test`` in pyproject.toml.

   To add an optional dependency's tests: import it with
   ``pytest.importorskip(module)`` (module level or in the test), then add
   ``module: "why it is optional; pip install ..."`` to ``OPTIONAL_MODULES``.

Any other skip under CI fails: ``pytest.skip(...)``, ``skipif`` markers, a test
marked ``test_hooks`` in a build without them, a missing C compiler. Outside CI
every skip is reported as usual (``-ra`` lists them). xfail is not a skip.

Also under CI, the session refuses to start unless the build under test has
what the suite exercises: zstd and io_uring usable, and the test hooks compiled
in (``ci_build_problems``); otherwise tests parametrised over the backends that
are usable would quietly test less.
"""
from __future__ import annotations

import json
import os
import re
import struct
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import tokenfeed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")

# Top-level module -> why it is not in the `test` extra and how to install it.
# Under CI, a skip from pytest.importorskip of one of these is allowed.
OPTIONAL_MODULES: Dict[str, str] = {}

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


# ------------------------------------------------------------- helpers the test modules import

def documents(ds: tokenfeed.Dataset) -> List[np.ndarray]:
    """Every document of ``ds``, as int64 arrays."""
    return [ds.document(i).astype(np.int64) for i in range(ds.num_documents)]


def assert_docs_equal(got: Sequence[np.ndarray], want: Sequence[Any]) -> None:
    """Same number of documents, each with the same token ids."""
    assert len(got) == len(want), (len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, np.asarray(w, dtype=np.int64)), f"document {i} differs"


def bpe_tokenizer(texts: Iterable[str], vocab_size: int = 400, special_tokens: Sequence[str] = ("[UNK]", "<|endoftext|>"),
                  byte_level: bool = True) -> Any:
    """A BPE tokenizer (Hugging Face ``tokenizers``) trained here on ``texts``: nothing is downloaded.

    ``byte_level``: GPT-2 style byte-level pre-tokenizer and decoder, else whitespace splitting.
    Without ``<|endoftext|>`` in ``special_tokens`` it has no end-of-document token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    extra: Dict[str, Any] = {}
    if byte_level:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        extra["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                                       show_progress=False, **extra))
    return tok


def tokenizer_json(directory: Any, texts: Iterable[str], **kw: Any) -> str:
    """:func:`bpe_tokenizer` trained on ``texts``, saved as ``directory/tokenizer.json``; its path."""
    path = os.path.join(os.fspath(directory), "tokenizer.json")
    bpe_tokenizer(texts, **kw).save(path)
    return path


def kill_when_logged(p: Any, log: Any, lines: int, what: str = "the run") -> None:
    """SIGKILL the subprocess p once its log file holds at least `lines` lines (bounded: 300 s);
    fail the test if it finished first."""
    import signal
    import time

    deadline = time.time() + 300
    while time.time() < deadline:
        if os.path.exists(log) and sum(1 for _ in open(log)) >= lines:
            break
        if p.poll() is not None:
            pytest.fail(f"{what} finished before it could be killed: " + p.stderr.read().decode())
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate()


def write_eos_documents(path: Any, n_docs: int = 300, seed: int = 0) -> str:
    """A headerless uint16 token file of n_docs short documents (ids 1..249), each ended by
    the end-of-document id 0: what the trainer-integration tests train on."""
    rng = np.random.default_rng(seed)
    np.concatenate([np.append(rng.integers(1, 250, size=int(rng.integers(5, 60))), 0)
                    for _ in range(n_docs)]).astype(np.uint16).tofile(str(path))
    return str(path)


def numpy_loader(data: Any, **kw: Any) -> tokenfeed.Loader:
    """A Loader with NumPy output and two threads unless told. ``data`` as for Loader; a tuple of
    datasets is a mixture, as a list is."""
    kw.setdefault("output", "numpy")
    kw.setdefault("num_threads", 2)
    return tokenfeed.Loader(list(data) if isinstance(data, tuple) else data, **kw)


def take_tokens(loader: Any, n: int, key: str = "tokens") -> List[np.ndarray]:
    """The ``key`` array of the loader's next ``n`` batches, copied."""
    return [next(loader)[key].copy() for _ in range(n)]


def assert_resumes_exactly(data: Any, k: int, n: int, **kw: Any) -> Tuple[Dict[str, Any], List[np.ndarray]]:
    """The state saved after ``k`` batches (through JSON, as a checkpoint keeps it), restored into a
    new loader, continues with exactly the ``n`` batches that the uninterrupted stream has next.
    Returns the state and the uninterrupted stream's first ``k + n`` batches."""
    whole = take_tokens(numpy_loader(data, **kw), k + n)
    first = numpy_loader(data, **kw)
    take_tokens(first, k)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = numpy_loader(data, **kw)
    resumed.load_state_dict(state)
    got = take_tokens(resumed, n)
    assert all(np.array_equal(x, y) for x, y in zip(whole[k:], got)), f"resumed after {k} batches: {kw}"
    return state, whole


# Foreign formats, written by hand following each format's published layout (independent of
# tokenfeed's readers, so that reading them back checks the readers).

#: Megatron ``MMIDIDX`` dtype codes (megatron/core/datasets/indexed_dataset.py, ``DType``)
MEGATRON_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
                  8: np.uint16}


def write_megatron(prefix: Any, docs: Sequence[Any], code: int = 8) -> None:
    """``prefix.bin`` and ``prefix.idx`` (MMIDIDX v1) as Megatron-LM's indexed_dataset.py writes them;
    ``code`` is the token dtype's code in ``MEGATRON_CODES`` (8: uint16)."""
    dt = np.dtype(MEGATRON_CODES[code])
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1].astype(np.int64) * dt.itemsize)]).astype(np.int64)
    doc_idx = np.arange(len(docs) + 1, dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype=dt).tobytes())


def write_llmc(path: Any, tokens: Any, version: int = 1) -> None:
    """An llm.c shard as dev/data/data_common.py write_datafile makes it: 256 int32 header words (magic,
    version, token count), then the tokens (version 1: uint16, GPT-2; version 7: uint32, Llama 3)."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1] = (20240520, 1) if version == 1 else (20240801, 7)
    header[2] = len(tokens)
    dt = np.uint16 if version == 1 else np.uint32
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=dt).tobytes())


def write_nemo_nanogpt(path: Any, docs: Any, itemsize: int = 2, bos_idx: bool = True) -> Any:
    """A NeMo AutoModel nanogpt shard as its tools/nanogpt_data_processor.py writes it: 256 int32
    header words (magic 278895051, version 1, token count, bytes per token), then the tokens; with
    bos_idx, the sidecar (the path's last extension replaced by .bos.idx) of int32 document starts.
    Returns the flat tokens."""
    flat = np.concatenate([np.asarray(d) for d in docs]) if len(docs) else np.zeros(0)
    header = np.zeros(256, dtype=np.int32)
    header[:4] = (278895051, 1, len(flat), itemsize)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(flat.astype(np.uint16 if itemsize == 2 else np.uint32).tobytes())
    if bos_idx:
        starts = np.cumsum([0] + [len(d) for d in docs[:-1]]).astype(np.int32)
        starts.tofile(os.path.splitext(str(path))[0] + ".bos.idx")
    return flat

def aged(paths: Iterable[Any], seconds: int = 60) -> None:
    """Back-date files and directories: the node's catalog records only what was left
    unmodified for 2 s (a change within the file system's timestamp granularity would go
    unseen), so a test's freshly written set is made old enough to enter it."""
    for p in paths:
        st = os.stat(p)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 1_000_000_000))


def llmc_shard_set(d: Any, n: int = 12, per: int = 50) -> List[str]:
    """A directory of n llm.c shards of per tokens each (shard i holds 100*i, 100*i+1, ...),
    old enough to be catalogued; their paths in name order."""
    os.makedirs(d, exist_ok=True)
    files = []
    for i in range(n):
        p = os.path.join(str(d), f"shard_{i:03d}.bin")
        write_llmc(p, (np.arange(per) + 100 * i).astype(np.uint16))
        files.append(p)
    aged(files)
    return files


def forbid_listing(monkeypatch: Any) -> None:
    """From now on a shard set cannot be listed: an open that still works read it from a catalog."""
    # the core lists local directories (csrc/sources/pathspec.c) and remote prefixes
    # (csrc/remote/remote_spec.c): test builds refuse to while this is set
    monkeypatch.setenv("TOKENFEED_FAULT_NO_LISTING", "1")



# The node's catalog of multi-file datasets (csrc/sources/catalog.c) goes to a directory of
# this test session, not the user's ~/.cache.
os.environ.setdefault("TOKENFEED_CATALOG_DIR", tempfile.mkdtemp(prefix="tokenfeed-catalog-"))
