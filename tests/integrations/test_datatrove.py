"""The datatrove step (tokenfeed.integrations.datatrove), ``tokenfeed convert --tasks``
and docs/examples/datatrove_convert.py.

Every comparison is document for document against what single-process ``tokenfeed
convert`` writes from the same JSONL with the same tokenizer (trained here: nothing is
downloaded), in the documented order:

- ``convert --tasks N``: task k reads a contiguous share of the input chunks, so the
  merged dataset has convert's order exactly;
- datatrove's own JsonlReader: task k reads files k, k + N, ... of the sorted list, so
  the merged dataset is part 0's files, then part 1's, ...
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from typing import Dict, List

import numpy as np
import pytest

import tokenfeed
from conftest import assert_docs_equal, bpe_tokenizer, documents, tokenizer_json
from tokenfeed.cli import main

pytest.importorskip("tokenizers")
pytest.importorskip("datatrove")  # in the test extra: CI fails this skip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "docs", "examples", "datatrove_convert.py")
WORDS = ("tokens feed the loader while tasks write parts and a merge joins them without copying any "
         "data so the cluster stays busy every epoch").split()
N_FILES = 6


def texts(n: int, seed: int) -> List[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, 90))
        t = " ".join(WORDS[int(j)] for j in rng.integers(0, len(WORDS), size=k))
        out.append("" if i % 13 == 5 else ("   " if i % 29 == 7 else t))  # empty and blank texts are left out
    return out


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory) -> str:
    return tokenizer_json(tmp_path_factory.mktemp("tok"), texts(400, seed=99))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Dict[str, List[str]]:
    """N_FILES JSONL files of different sizes (file name -> texts, in sorted file order)."""
    d = tmp_path_factory.mktemp("corpus")
    files: Dict[str, List[str]] = {}
    for f in range(N_FILES):
        ts = texts(40 + 37 * f, seed=f)
        name = f"shard_{f:02d}.jsonl"
        with open(d / name, "w") as fp:
            for t in ts:
                fp.write(json.dumps({"id": name, "text": t}) + "\n")
        files[name] = ts
    files["__dir__"] = [str(d)]
    return files


def corpus_files(corpus: Dict[str, List[str]]) -> List[str]:
    return sorted(k for k in corpus if k != "__dir__")


@pytest.fixture(scope="module")
def single(corpus, tok_path, tmp_path_factory) -> tokenfeed.Dataset:
    """What single-process ``tokenfeed convert`` writes from the corpus."""
    out = tmp_path_factory.mktemp("single") / "ds"
    assert main(["convert", corpus["__dir__"][0], str(out), "--tokenizer", tok_path, "--workers", "1"]) == 0
    return tokenfeed.open(out)


def per_file_docs(single: tokenfeed.Dataset, corpus) -> Dict[str, List[np.ndarray]]:
    """convert's documents split by input file (it reads files in sorted order; blank texts are left out)."""
    docs = documents(single)
    out, at = {}, 0
    for name in corpus_files(corpus):
        n = sum(1 for t in corpus[name] if t.strip())
        out[name] = docs[at:at + n]
        at += n
    assert at == len(docs)
    return out


def datatrove_order(single, corpus, tasks: int) -> List[np.ndarray]:
    """The documented order of a merged datatrove run: task k reads files k, k + tasks, ... (sorted)."""
    by_file = per_file_docs(single, corpus)
    names = corpus_files(corpus)
    return [d for k in range(tasks) for name in names[k::tasks] for d in by_file[name]]


def run_py(code: str, *, env_extra: Dict[str, str] | None = None, new_session: bool = False,
           timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          start_new_session=new_session, timeout=timeout)


# --------------------------------------------------------------------------- import


def test_import_tokenfeed_does_not_import_datatrove():
    p = run_py("import sys, tokenfeed, tokenfeed.cli; "
               "print(sorted(m for m in sys.modules if m.split('.')[0] in ('datatrove', 'tokenfeed.integrations')))")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


# --------------------------------------------------------------------------- convert --tasks


def test_convert_tasks_equals_single_process(corpus, tok_path, single, tmp_path, capsys):
    """4 tasks on 2 workers of datatrove's local executor: convert's documents, in convert's order."""
    out = tmp_path / "tasks"
    rc = main(["convert", corpus["__dir__"][0], str(out), "--tokenizer", tok_path, "--tasks", "4", "--workers", "2"])
    _, err = capsys.readouterr()
    assert rc == 0, err
    ds = tokenfeed.open(out)
    assert_docs_equal(documents(ds), documents(single))
    assert ds.num_tokens == single.num_tokens and ds.vocab_size == single.vocab_size and ds.dtype == single.dtype
    blank = sum(1 for k in corpus_files(corpus) for t in corpus[k] if not t.strip())
    assert f"skipped {blank:,} empty or missing texts" in err
    assert sorted(os.listdir(out)) == ["parts", "tokenfeed.manifest"]  # the work directory is gone
    assert len(os.listdir(out / "parts")) == 4
    assert "Stats" in err  # datatrove's own per-task stats
    ds.verify()
    # same input, same task count: same fingerprint
    out2 = tmp_path / "tasks2"
    assert main(["convert", corpus["__dir__"][0], str(out2), "--tokenizer", tok_path, "--tasks", "4",
                 "--workers", "1"]) == 0
    assert tokenfeed.open(out2).fingerprint == ds.fingerprint
    # the finished dataset is refused without --overwrite, replaced with it
    assert main(["convert", corpus["__dir__"][0], str(out), "--tokenizer", tok_path, "--tasks", "3"]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main(["convert", corpus["__dir__"][0], str(out), "--tokenizer", tok_path, "--tasks", "3",
                 "--workers", "1", "--overwrite"]) == 0
    again = tokenfeed.open(out)
    assert_docs_equal(documents(again), documents(single))
    assert len(os.listdir(out / "parts")) == 3


def test_convert_tasks_parquet(tmp_path, tok_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    ts = [t for t in texts(300, seed=5) if t.strip()]
    pq.write_table(pa.table({"content": ts}), tmp_path / "c.parquet", row_group_size=40)
    args = [str(tmp_path / "c.parquet"), "--tokenizer", tok_path, "--text-field", "content", "--no-eod"]
    assert main(["convert", args[0], str(tmp_path / "one"), *args[1:]]) == 0
    assert main(["convert", args[0], str(tmp_path / "many"), *args[1:], "--tasks", "3", "--workers", "1"]) == 0
    capsys.readouterr()
    assert_docs_equal(documents(tokenfeed.open(tmp_path / "many")), documents(tokenfeed.open(tmp_path / "one")))


def test_convert_tasks_errors(corpus, tok_path, tmp_path, capsys):
    assert main(["convert", corpus["__dir__"][0], str(tmp_path / "o"), "--tokenizer", tok_path, "--tasks", "0"]) == 1
    assert "--tasks must be >= 1" in capsys.readouterr().err
    # a task that fails (a text field missing) reports the cause and leaves no dataset
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    assert main(["convert", str(bad), str(tmp_path / "b"), "--tokenizer", tok_path, "--tasks", "2",
                 "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert "a conversion task failed" in err and "no field 'text'" in err and "--resume" in err
    assert not (tmp_path / "b" / "tokenfeed.manifest").exists()


# --------------------------------------------------------------------------- the step in a datatrove pipeline


def test_example_local_executor_equals_single_process(corpus, tok_path, single, tmp_path):
    """docs/examples/datatrove_convert.py: datatrove's JsonlReader, 4 tasks, 2 workers, then merge."""
    out = tmp_path / "ex"
    p = subprocess.run([sys.executable, EXAMPLE, corpus["__dir__"][0], str(out), tok_path, "--tasks", "4",
                        "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "wrote" in p.stdout
    ds = tokenfeed.open(out)
    assert_docs_equal(documents(ds), datatrove_order(single, corpus, 4))
    ds.verify()


def test_step_pretokenized_input(tmp_path):
    """tokenizer=None: the ids in document.metadata['input_ids'], an end-of-document id if asked."""
    from datatrove.data import Document

    from tokenfeed.integrations.datatrove import TokenfeedWriter

    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 70000, size=int(rng.integers(0, 30))) for _ in range(50)]
    for rank in range(2):
        step = TokenfeedWriter(tmp_path / "ds", vocab_size=70001, eod_id=70000, batch_size=7)
        docs = [Document(text="", id=str(i), metadata={"input_ids": ids[i]}) for i in range(rank, 50, 2)]
        passed = list(step.run(iter(docs), rank=rank, world_size=2))
        assert passed == docs  # documents pass through to later steps
    ds = tokenfeed.merge_parts(tmp_path / "ds")
    want = [np.append(ids[i], 70000) for r in range(2) for i in range(r, 50, 2) if len(ids[i])]
    assert_docs_equal(documents(ds), want)
    assert ds.dtype == np.uint32 and ds.vocab_size == 70001
    with pytest.raises(ValueError, match="needs vocab_size"):
        TokenfeedWriter(tmp_path / "x")
    step = TokenfeedWriter(tmp_path / "y", vocab_size=10)
    with pytest.raises(Exception, match="no metadata\\['input_ids'\\]"):
        list(step.run(iter([Document(text="a", id="d0")])))
    assert not os.path.exists(tmp_path / "y" / "parts" / "part-00000")  # nothing published


def test_step_refuses_tokenizer_without_eod(tmp_path):
    from datatrove.data import Document

    from tokenfeed.integrations.datatrove import TokenfeedWriter

    tok = bpe_tokenizer(["a b c d"] * 10, vocab_size=40, special_tokens=["[UNK]"], byte_level=False)
    with pytest.raises(Exception, match="no end-of-document token"):
        list(TokenfeedWriter(tmp_path / "o", tokenizer=tok).run(iter([Document(text="a b", id="0")])))
    out = list(TokenfeedWriter(tmp_path / "o", tokenizer=tok, eod_id=None).run(iter([Document(text="a b", id="0")])))
    assert len(out) == 1
    assert tokenfeed.merge_parts(tmp_path / "o").num_documents == 1


# --------------------------------------------------------------------------- a worker killed


KILLER = '''
import os, signal
from datatrove.pipeline.base import PipelineStep


class KillAt(PipelineStep):
    """Passes documents on; in task `rank`, at document `at`, SIGKILLs the whole run (its process group:
    the executor, its workers and datatrove's helper processes), once (a marker file remembers)."""
    name = "kill"
    type = "test"

    def __init__(self, rank, at, marker):
        super().__init__()
        self.rank, self.at, self.marker = rank, at, marker

    def run(self, data, rank=0, world_size=1):
        for i, doc in enumerate(data):
            if rank == self.rank and i == self.at and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os.killpg(os.getpgid(0), signal.SIGKILL)
            yield doc
'''


def test_worker_killed_then_rerun_no_duplicate_no_missing(corpus, tok_path, single, tmp_path):
    """4 tasks on 2 workers; task 2 is SIGKILLed at its 30th document, mid-write (small batches and
    shards); the run is repeated: datatrove skips the finished tasks, the others write their parts
    again, and the merge holds every document exactly once, in the documented order."""
    (tmp_path / "killer.py").write_text(KILLER)
    out, logs, marker = tmp_path / "ds", tmp_path / "logs", tmp_path / "killed"
    code = textwrap.dedent(f"""
        import os
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        from datatrove.executor import LocalPipelineExecutor
        from datatrove.pipeline.readers import JsonlReader
        from killer import KillAt
        from tokenfeed.integrations.datatrove import TokenfeedWriter
        LocalPipelineExecutor(
            [JsonlReader({corpus["__dir__"][0]!r}, glob_pattern="*.jsonl"),
             KillAt(rank=2, at=30, marker={str(marker)!r}),
             TokenfeedWriter({str(out)!r}, tokenizer={tok_path!r}, batch_size=4, shard_tokens=300)],
            tasks=4, workers=2, logging_dir={str(logs)!r}).run()
    """)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    first = run_py(code, env_extra=env, new_session=True)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert marker.exists()
    assert not (out / "tokenfeed.manifest").exists()
    names = os.listdir(out / "parts")
    assert "part-00002" not in names
    staging = [n for n in names if n.startswith(".part-00002.") and n.endswith(".tmp")]
    assert ".part-00002.lock" in names  # its lock file; the next attempt takes the lock and removes it
    assert staging and any(f.endswith(".tfs") for f in os.listdir(out / "parts" / staging[0]))  # died mid-write
    done = sorted(os.listdir(logs / "completions"))
    assert "00002" not in done and done  # 2 workers: task 2 started after task 0 or 1 had finished
    kept = {n: os.stat(out / "parts" / n).st_ino for n in names if not n.startswith(".")}
    assert {f"part-{int(d):05d}" for d in done} <= set(kept)

    second = run_py(code, env_extra=env, new_session=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert sorted(os.listdir(out / "parts")) == [f"part-{k:05d}" for k in range(4)]  # staging cleaned up
    for d in done:  # finished tasks were not run again
        assert os.stat(out / "parts" / f"part-{int(d):05d}").st_ino == kept[f"part-{int(d):05d}"]
    ds = tokenfeed.merge_parts(out)
    assert_docs_equal(documents(ds), datatrove_order(single, corpus, 4))
    ds.verify()


def test_convert_tasks_killed_then_resume(corpus, tok_path, single, tmp_path, capsys):
    """``convert --tasks 4`` SIGKILLed inside task 2; ``--resume`` keeps tasks 0 and 1, redoes 2 and 3."""
    out, marker = tmp_path / "ds", tmp_path / "killed"
    code = textwrap.dedent(f"""
        import os, signal, sys
        import tokenfeed.integrations.datatrove as dt
        from tokenfeed.cli import main
        real = dt.ConvertReader.run
        def run(self, data=None, rank=0, world_size=1):
            for i, doc in enumerate(real(self, data, rank, world_size)):
                if rank == 2 and i == 10 and not os.path.exists({str(marker)!r}):
                    open({str(marker)!r}, "w").close()
                    os.killpg(os.getpgid(0), signal.SIGKILL)  # with datatrove's helper process
                yield doc
        dt.ConvertReader.run = run
        sys.exit(main(["convert", {corpus["__dir__"][0]!r}, {str(out)!r}, "--tokenizer", {tok_path!r},
                       "--tasks", "4", "--workers", "1", "--batch-docs", "4"]))
    """)
    p = run_py(code, new_session=True)
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    assert not (out / "tokenfeed.manifest").exists()
    assert sorted(n for n in os.listdir(out / "parts") if not n.startswith(".")) == ["part-00000", "part-00001"]
    kept = {n: os.stat(out / "parts" / n).st_ino for n in ("part-00000", "part-00001")}
    args = ["convert", corpus["__dir__"][0], str(out), "--tokenizer", tok_path, "--tasks", "4", "--workers", "2"]
    assert main(args) == 1
    assert "--resume" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "Skipping 2 already completed tasks" in err
    assert {n: os.stat(out / "parts" / n).st_ino for n in kept} == kept
    assert_docs_equal(documents(tokenfeed.open(out)), documents(single))


# --------------------------------------------------------------------------- Ray


def test_example_ray_executor(corpus, tok_path, single, tmp_path):
    """The same step under datatrove's Ray executor, on a local Ray cluster started here."""
    out = tmp_path / "ray"
    code = textwrap.dedent(f"""
        import sys, ray
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        sys.argv = ["datatrove_convert.py", {corpus["__dir__"][0]!r}, {str(out)!r}, {tok_path!r},
                    "--tasks", "4", "--workers", "2", "--executor", "ray", "--logging-dir", {str(tmp_path / "logs")!r}]
        import runpy
        try:
            runpy.run_path({EXAMPLE!r}, run_name="__main__")
        finally:
            ray.shutdown()
    """)
    p = run_py(code, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    ds = tokenfeed.open(out)
    assert_docs_equal(documents(ds), datatrove_order(single, corpus, 4))
