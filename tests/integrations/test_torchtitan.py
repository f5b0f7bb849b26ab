"""tokenfeed.integrations.torchtitan with torchtitan's own components: the loader built from
its Config as the Trainer builds it, batches in torchtitan's shape, and the state through
torchtitan's DCP CheckpointManager: resumed exactly, also on another data-parallel degree."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import tokenfeed
from torchtitan.components.dataloader import BaseDataLoader

from conftest import ROOT  # noqa: E402
from titan_ranks import L, build, train  # noqa: E402

from tokenfeed.integrations.torchtitan import IGNORE_INDEX, TokenfeedDataLoader  # noqa: E402


@pytest.fixture
def one_rank(tmp_path):
    """The process group the Trainer always has (its CheckpointManager asks for the rank): one gloo rank."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def reference(ds, n, batch_size, **kw):
    l = tokenfeed.Loader(ds, seq_len=L, batch_size=batch_size, seed=3, position_ids=True, loss_mask=True,
                         output="numpy", **kw)
    out = [{k: v.copy() for k, v in next(l).items()} for _ in range(n)]
    l.close()
    return out


def test_batches_in_torchtitans_shape(make_dataset, tmp_path):
    ds = make_dataset(n_docs=200, mean_len=20.0)
    model, dl, *_ = build(ds.paths[0], 0, 1, 4, str(tmp_path), seed=3)
    assert isinstance(dl, BaseDataLoader)
    ref = reference(ds, 5, 4)
    for want, (inputs, labels) in zip(ref, dl):
        assert set(inputs) == {"input", "positions"}
        assert inputs["input"].dtype == inputs["positions"].dtype == labels.dtype == torch.int64
        assert inputs["input"].shape == inputs["positions"].shape == labels.shape == (4, L)
        assert np.array_equal(inputs["input"].numpy(), want["input_ids"])
        assert np.array_equal(inputs["positions"].numpy(), want["position_ids"])
        trained = want["loss_mask"] != 0
        assert np.array_equal(labels.numpy()[trained], want["labels"][trained])
        assert (labels.numpy()[~trained] == IGNORE_INDEX).all() and (~trained).any()  # documents are short
        # positions restart at 0 where a document starts: what Flex/varlen attention masks are built from
        assert (inputs["positions"][:, 0] == 0).all()
    dl.close()


def test_config_checks(make_dataset, tmp_path):
    ds = make_dataset(n_docs=50)
    with pytest.raises(ValueError, match="dataset_path is empty"):
        TokenfeedDataLoader.Config().build(dp_world_size=1, dp_rank=0, seq_len=L, local_batch_size=2)
    with pytest.raises(ValueError, match="set by the trainer"):
        TokenfeedDataLoader.Config(dataset_path=ds.paths[0], loader={"batch_size": 3}).build(
            dp_world_size=1, dp_rank=0, seq_len=L, local_batch_size=2)
    with pytest.raises(TypeError):  # an unknown Loader keyword, refused when built
        TokenfeedDataLoader.Config(dataset_path=ds.paths[0], loader={"seqlen": 3}).build(
            dp_world_size=1, dp_rank=0, seq_len=L, local_batch_size=2)

    class Tok:
        def get_vocab_size(self):
            return 1000

    with pytest.raises(ValueError, match="another tokenizer"):
        TokenfeedDataLoader.Config(dataset_path=ds.paths[0]).build(dp_world_size=1, dp_rank=0, seq_len=L,
                                                                   local_batch_size=2, tokenizer=Tok())


def test_checkpoint_manager_resumes_exactly(make_dataset, tmp_path, one_rank):
    ds = make_dataset(n_docs=200)
    parts = build(ds.paths[0], 0, 1, 4, str(tmp_path), seed=3)
    first = train(*parts, steps=7, save_at=3)
    parts[-1].close()
    assert os.path.isdir(tmp_path / "checkpoint" / "step-3")
    # a new process's objects, loaded by the CheckpointManager from step 3
    model, dl, opt, lrs, ts, ckpt = build(ds.paths[0], 0, 1, 4, str(tmp_path), seed=3)
    assert ckpt.load(step=3)
    assert ts.step == 3
    again = train(model, dl, opt, lrs, ts, ckpt, steps=4)
    for a, b in zip(first[3:], again):
        for k in a:
            assert np.array_equal(a[k], b[k]), k
    ckpt.close()


def test_checkpoint_from_two_ranks_resumes_on_one(make_dataset, tmp_path, one_rank):
    """Saved by 2 data-parallel ranks (gloo, DCP), resumed on 1 rank with the same global batch:
    the global stream continues, the one rank's batch = the two ranks' batches side by side."""
    ds = make_dataset(n_docs=300)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        os.path.join(ROOT, "tests", "titan_ranks.py"), ds.paths[0], str(tmp_path), str(out),
                        "6", "3", "2"], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [np.load(out / f"rank{i}.npz") for i in range(2)]
    model, dl, opt, lrs, ts, ckpt = build(ds.paths[0], 0, 1, 4, str(tmp_path), seed=3)
    assert ckpt.load(step=3) and ts.step == 3
    again = train(model, dl, opt, lrs, ts, ckpt, steps=3)
    for s, b in zip(range(3, 6), again):
        for k in ("input", "positions", "labels"):
            assert np.array_equal(b[k], np.concatenate([ranks[0][f"{k}{s}"], ranks[1][f"{k}{s}"]])), (s, k)
    ckpt.close()


def test_example_job_config_builds_the_loader(make_dataset, tmp_path):
    """docs/examples/torchtitan_tokenfeed.py through torchtitan's own ConfigManager (what
    `-m torchtitan.train --module ... --config ...` parses), with overrides on its command line;
    the Config it yields builds the loader with the arguments the Trainer passes."""
    from torchtitan.config.manager import ConfigManager

    ds = make_dataset(n_docs=100)
    sys.path.insert(0, os.path.join(ROOT, "docs", "examples"))
    try:
        cfg = ConfigManager().parse_args(["--module", "torchtitan_tokenfeed", "--config",
                                          "llama3_debugmodel_tokenfeed", "--dataloader.dataset_path",
                                          ds.paths[0], "--dataloader.seed", "3", "--training.seq_len", str(L)])
    finally:
        sys.path.remove(os.path.join(ROOT, "docs", "examples"))
    assert isinstance(cfg.dataloader, TokenfeedDataLoader.Config) and cfg.dataloader.seed == 3
    assert cfg.dataloader.packing == "best_fit"
    dl = cfg.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=cfg.training.seq_len,
                              local_batch_size=2, snapshot_every_n_steps=None)
    ref = tokenfeed.Loader(ds, seq_len=L, batch_size=2, seed=3, packing="best_fit", output="numpy")
    for want, (inputs, _labels) in zip([next(ref)["input_ids"].copy() for _ in range(3)], dl):
        assert np.array_equal(inputs["input"].numpy(), want)
    dl.close()


def test_validator_pass_ends_with_a_finite_stream(make_dataset, tmp_path):
    """loader={"epochs": 1}: the stream ends after one epoch, as torchtitan's Validator expects."""
    ds = make_dataset(n_docs=40)
    dl = TokenfeedDataLoader.Config(dataset_path=ds.paths[0], seed=3, loader={"epochs": 1}).build(
        dp_world_size=1, dp_rank=0, seq_len=L, local_batch_size=2)
    ref = tokenfeed.Loader(ds, seq_len=L, batch_size=2, seed=3, epochs=1, output="numpy")
    want = [b["input_ids"].copy() for b in ref]
    got = [inputs["input"].numpy().copy() for inputs, _ in dl]
    assert len(got) == len(want) > 1 and all(np.array_equal(a, b) for a, b in zip(got, want))
    dl.close()


def titan_config(*argv):
    """The example job config through torchtitan's own ConfigManager, with ``argv`` overrides."""
    from torchtitan.config.manager import ConfigManager

    sys.path.insert(0, os.path.join(ROOT, "docs", "examples"))
    try:
        return ConfigManager().parse_args(["--module", "torchtitan_tokenfeed", "--config",
                                           "llama3_debugmodel_tokenfeed", "--training.seq_len", str(L), *argv])
    finally:
        sys.path.remove(os.path.join(ROOT, "docs", "examples"))


def test_mixture_from_the_job_config(make_dataset):
    """--dataloader.dataset_path a,b --dataloader.weights 0.3 0.7 on torchtitan's command line: a
    mixture of the two sources, as tokenfeed.Loader([a, b], weights=[0.3, 0.7]) gives it; a weight
    schedule in loader={"weights": ...} too; a count that does not match is refused naming both."""
    a, b = make_dataset(n_docs=120, seed=1), make_dataset(n_docs=120, seed=2)
    cfg = titan_config("--dataloader.dataset_path", f"{a.paths[0]},{b.paths[0]}", "--dataloader.weights", "0.3",
                       "0.7", "--dataloader.seed", "3")
    assert cfg.dataloader.weights == [0.3, 0.7]
    dl = cfg.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=L, local_batch_size=4,
                              snapshot_every_n_steps=None)
    assert dl.weights == [0.3, 0.7]
    ref = tokenfeed.Loader([a, b], weights=[0.3, 0.7], seq_len=L, batch_size=4, seed=3, packing="best_fit",
                           source_ids=True, output="numpy")
    seen = set()
    for _, (inputs, _labels) in zip(range(6), dl):
        want = next(ref)
        seen |= set(want["source_ids"].tolist())
        assert np.array_equal(inputs["input"].numpy(), want["input_ids"])
    assert seen == {0, 1}
    dl.close()
    schedule = [(0, [1.0, 0.0]), (2, [0.0, 1.0])]
    dl = TokenfeedDataLoader.Config(dataset_path=f"{a.paths[0]}, {b.paths[0]}", seed=3,
                                    loader={"weights": schedule}).build(dp_world_size=1, dp_rank=0, seq_len=L,
                                                                        local_batch_size=4)
    ref = tokenfeed.Loader([a, b], weights=schedule, seq_len=L, batch_size=4, seed=3, output="numpy")
    for _, (inputs, _labels) in zip(range(4), dl):
        assert np.array_equal(inputs["input"].numpy(), next(ref)["input_ids"])
    dl.close()
    with pytest.raises(ValueError, match=r"(?s)3 comma-separated entries.*the weights 2"):
        TokenfeedDataLoader.Config(dataset_path=f"{a.paths[0]},{b.paths[0]},{a.paths[0]}",
                                   weights=[0.5, 0.5]).build(dp_world_size=1, dp_rank=0, seq_len=L,
                                                              local_batch_size=2)
    with pytest.raises(ValueError, match="both set"):
        TokenfeedDataLoader.Config(dataset_path=f"{a.paths[0]},{b.paths[0]}", weights=[0.5, 0.5],
                                   loader={"weights": [0.5, 0.5]}).build(dp_world_size=1, dp_rank=0, seq_len=L,
                                                                         local_batch_size=2)


def test_set_weights_is_kept_by_the_checkpoint(make_dataset, tmp_path, one_rank):
    """set_weights during the run (as a training hook would call it) changes the mixture from the next
    batch on; torchtitan's CheckpointManager keeps the change, so a run resumed from the checkpoint
    reads with the new weights although its config still has the old ones."""
    a, b = make_dataset(n_docs=200, seed=1), make_dataset(n_docs=200, seed=2)
    path = f"{a.paths[0]},{b.paths[0]}"
    model, dl, opt, lrs, ts, ckpt = build(path, 0, 1, 4, str(tmp_path), seed=3, weights=[0.5, 0.5])
    first = train(model, dl, opt, lrs, ts, ckpt, steps=2)
    dl.set_weights([0.1, 0.9])
    assert dl.weights == [0.1, 0.9]
    first += train(model, dl, opt, lrs, ts, ckpt, steps=5, save_at=4)
    ckpt.close()
    ref = tokenfeed.Loader([a, b], weights=[0.5, 0.5], seq_len=L, batch_size=4, seed=3, output="numpy")
    want = [next(ref)["input_ids"].copy() for _ in range(2)]
    ref.set_weights([0.1, 0.9])
    want += [next(ref)["input_ids"].copy() for _ in range(5)]
    assert all(np.array_equal(g["input"], w) for g, w in zip(first, want))
    model, dl, opt, lrs, ts, ckpt = build(path, 0, 1, 4, str(tmp_path), seed=3, weights=[0.5, 0.5])
    assert ckpt.load(step=4) and ts.step == 4
    assert dl.weights == [0.1, 0.9]
    again = train(model, dl, opt, lrs, ts, ckpt, steps=3)
    for s, g in zip(range(4, 7), again):
        assert np.array_equal(g["input"], want[s]), s
    ckpt.close()
