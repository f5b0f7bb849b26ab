"""tokenfeed.integrations.olmo_core: OLMo-core's Trainer trains from tokenfeed, stops and
resumes with identical batches and losses; the loader follows OLMo's data-loader protocol
(tokens per global batch, rank slices, reshuffle, state) over OLMo's token files."""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest


import tokenfeed  # noqa: E402
from tokenfeed.integrations.olmo_core import TokenfeedDataLoader  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helper scripts are
SEQ = 32


def olmo_files(d, nfiles=2, seed=0):
    """Token files as OLMo's tokenizer writes them: uint32, headerless, eos (0) after each document."""
    rng = np.random.default_rng(seed)
    for f in range(nfiles):
        docs = [np.append(rng.integers(1, 250, size=int(rng.integers(5, 60))), 0) for _ in range(200)]
        np.concatenate(docs).astype(np.uint32).tofile(os.path.join(d, f"part-{f}-00000.npy"))
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".npy"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(data, work, out, *extra):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(tokenfeed.__path__[0]), env.get("PYTHONPATH")] if p)
    r = subprocess.run([sys.executable, os.path.join(HERE, "olmo_core_train.py"), data, work, out, *extra],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return np.load(out)


def test_trainer_stops_and_resumes_exactly(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    olmo_files(str(data))
    r = train(str(data), str(tmp_path), str(tmp_path / "runs.npz"))
    assert len(r["full_ids"]) == 6 and len(r["first_ids"]) == 3 and len(r["rest_ids"]) == 3
    assert os.path.isdir(tmp_path / "b" / "step3")  # the rest resumed from the Trainer's checkpoint
    assert np.array_equal(r["full_ids"], np.concatenate([r["first_ids"], r["rest_ids"]]))
    assert len(r["full_loss"]) == 6
    assert np.array_equal(r["full_loss"], np.concatenate([r["first_loss"], r["rest_loss"]]))


def test_trainer_continues_a_run_of_olmos_loader(tmp_path):
    """Three steps on OLMo's own NumpyFSLDataLoader, checkpointed by the Trainer, then the rest on
    TokenfeedDataLoader(order="olmo") from that checkpoint: the same batches and losses as six
    steps on OLMo's loader."""
    data = tmp_path / "data"
    data.mkdir()
    olmo_files(str(data))
    r = train(str(data), str(tmp_path), str(tmp_path / "runs.npz"), "switch")
    assert len(r["full_ids"]) == 6 and len(r["first_ids"]) == 3 and len(r["rest_ids"]) == 3
    assert np.array_equal(r["full_ids"], np.concatenate([r["first_ids"], r["rest_ids"]]))
    assert np.array_equal(r["full_loss"], np.concatenate([r["first_loss"], r["rest_loss"]]))


def loader(files, **kw):
    kw.setdefault("sequence_length", SEQ)
    kw.setdefault("global_batch_size", 8 * SEQ)
    return TokenfeedDataLoader.from_paths(files, dtype="uint32", eos_token_id=0, work_dir="/tmp", **kw)


def epoch(dl, n=None, epoch=1):
    dl.reshuffle(epoch)
    out = []
    for b in dl:
        out.append(b)
        if n is not None and len(out) == n:
            break
    return out


def test_protocol_ranks_and_elastic_resume(tmp_path):
    files = olmo_files(str(tmp_path))
    one = loader(files)
    assert one.total_batches == one._loader.num_samples // 8 and len(one) == one.total_batches
    ref = epoch(one)
    assert len(ref) == one.total_batches and one.tokens_processed == one.total_batches * 8 * SEQ
    for b in ref:
        assert b["input_ids"].shape == (8, SEQ) and b["labels"].shape == (8, SEQ)
    one.reset()
    ref2 = epoch(one, epoch=2)  # another epoch, another order
    assert not all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(ref, ref2))
    # two data-parallel ranks: their slices make the global batch
    ranks = [loader(files, dp_world_size=2, dp_rank=r) for r in range(2)]
    parts = [epoch(dl, 3) for dl in ranks]
    for k in range(3):
        assert np.array_equal(np.concatenate([parts[0][k]["input_ids"], parts[1][k]["input_ids"]]),
                              ref[k]["input_ids"])
    # a state saved on 2 ranks continues on 1 (the Trainer stores it in its checkpoint)
    state = ranks[0].state_dict()
    again = loader(files)
    again.load_state_dict(state)
    rest = epoch(again, 2)
    assert again.batches_processed == 5
    for k in range(2):
        assert np.array_equal(rest[k]["input_ids"], ref[3 + k]["input_ids"])
    with pytest.raises(ValueError, match="TokenfeedDataLoader state"):
        again.load_state_dict({"batches_processed": 3, "epoch": 1})


def test_documents_labels_and_doc_lens(tmp_path):
    files = olmo_files(str(tmp_path), nfiles=1)
    dl = loader(files, document_masking=True, shuffle=False)
    b = epoch(dl, 1)[0]
    ids, labels = b["input_ids"].numpy(), b["labels"].numpy()
    toks = np.fromfile(files[0], np.uint32)
    assert np.array_equal(ids[0], toks[:SEQ])
    # the label after each eos opens a new document: not trained on
    assert np.array_equal(labels[0] == -100, toks[:SEQ] == 0)
    assert np.array_equal(labels[0][toks[:SEQ] != 0], toks[1:SEQ + 1][toks[:SEQ] != 0])
    # doc_lens: OLMo's documents (split at eos), each row's lengths summing to SEQ
    d = b["doc_lens"].numpy()
    assert np.array_equal(d.sum(axis=1), np.full(8, SEQ))
    ends = np.flatnonzero(toks[:SEQ] == 0) + 1
    assert list(d[0][d[0] > 0]) == list(np.diff(np.concatenate([[0], ends[ends < SEQ], [SEQ]])))
    assert b["max_doc_lens"] == [int(x) for x in d.max(axis=1)]
    mock = dl.get_mock_batch()
    assert mock["input_ids"].shape == (8, SEQ) and mock["doc_lens"].shape == (8, 2)


def test_guide_example_runs_and_resumes(tmp_path):
    """docs/examples/olmo_core_train.py, as the guide runs it: 2 steps, then on to 4."""
    ex = os.path.join(os.path.dirname(HERE), "docs", "examples", "olmo_core_train.py")
    env = dict(os.environ, MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(tokenfeed.__path__[0]), env.get("PYTHONPATH")] if p)
    for steps, extra in ((2, ["--make-data"]), (4, [])):
        r = subprocess.run([sys.executable, ex, str(tmp_path / "data"), str(tmp_path / "ckpt"), str(steps), *extra],
                           env=env, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert os.path.isdir(tmp_path / "ckpt" / "step4")


def test_batch_size_schedule_is_refused(tmp_path):
    dl = loader(olmo_files(str(tmp_path), nfiles=1))
    dl.reshuffle(1)
    it = iter(dl)
    next(it)
    next(it)
    dl.global_batch_size = 16 * SEQ  # what OLMo's batch-size scheduler does, after 2 batches
    with pytest.raises(RuntimeError, match="keeps its global batch size"):
        next(it)
