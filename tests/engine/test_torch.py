"""PyTorch integration: the DataLoader paths give the Loader's samples and resume
exactly; a Loader survives fork and spawn; torchrun ranks partition the stream."""
from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tokenfeed

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from tokenfeed.torch import ResumableSampler, TokenBatches, TokenDataset  # noqa: E402

from conftest import ROOT  # noqa: E402

L, B = 24, 4


def loader_batches(ds, n, **kw):
    kw.setdefault("seed", 3)
    l = tokenfeed.Loader(ds, seq_len=L, batch_size=B, output="numpy", **kw)
    out = [next(l)["input_ids"].copy() for _ in range(n)]
    l.close()
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_map_style_dataloader_matches_loader(make_dataset, workers):
    ds = make_dataset(n_docs=150)
    ref = loader_batches(ds, 10)
    dl = DataLoader(TokenDataset(ds, seq_len=L, seed=3), sampler=ResumableSampler(batch_size=B, rank=0, world_size=1),
                    batch_size=B, num_workers=workers)
    it = iter(dl)
    for b in range(10):
        batch = next(it)
        assert np.array_equal(batch["input_ids"].numpy(), ref[b])
        assert np.array_equal(batch["labels"][:, :-1].numpy(), ref[b][:, 1:])


def test_map_style_ranks_match_loader_ranks(make_dataset):
    ds = make_dataset(n_docs=150)
    for r in range(2):
        ref = loader_batches(ds, 5, rank=r, world_size=2)
        dl = DataLoader(TokenDataset(ds, seq_len=L, seed=3),
                        sampler=ResumableSampler(batch_size=B, rank=r, world_size=2), batch_size=B)
        for b, batch in zip(range(5), dl):
            assert np.array_equal(batch["input_ids"].numpy(), ref[b])


def test_sampler_epochs_and_len(make_dataset):
    ds = make_dataset(n_docs=40)
    td = TokenDataset(ds, seq_len=L)
    s = ResumableSampler(td, batch_size=B, rank=0, world_size=1, epochs=2)
    positions = list(s)
    assert len(positions) == len(s) == (2 * td.num_samples) // B * B
    first_epoch = [td._order.sample_at(p) for p in range(td.num_samples)]
    assert sorted(first_epoch) == list(range(td.num_samples))


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(make_dataset, workers):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    ds = make_dataset(n_docs=150)
    ref = loader_batches(ds, 16)

    def make():
        return sdl.StatefulDataLoader(TokenDataset(ds, seq_len=L, seed=3),
                                      sampler=ResumableSampler(batch_size=B, rank=0, world_size=1),
                                      batch_size=B, num_workers=workers)

    dl = make()
    it = iter(dl)
    for b in range(7):
        assert np.array_equal(next(it)["input_ids"].numpy(), ref[b])
    state = dl.state_dict()
    del it, dl
    dl2 = make()
    dl2.load_state_dict(state)
    it2 = iter(dl2)
    for b in range(7, 16):
        assert np.array_equal(next(it2)["input_ids"].numpy(), ref[b]), f"batch {b}"


def test_plain_sampler_state_roundtrip(make_dataset):
    ds = make_dataset(n_docs=150)
    ref = loader_batches(ds, 12)
    s = ResumableSampler(batch_size=B, rank=0, world_size=1)
    s.load_state_dict({"position": s.position_after(5)})
    dl = DataLoader(TokenDataset(ds, seq_len=L, seed=3), sampler=s, batch_size=B, num_workers=2)
    for b, batch in zip(range(5, 12), dl):
        assert np.array_equal(batch["input_ids"].numpy(), ref[b])


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_iterable_batches_split_across_workers(make_dataset, workers):
    ds = make_dataset(n_docs=150)
    ref = loader_batches(ds, 12)
    dl = DataLoader(TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1, seed=3), batch_size=None,
                    num_workers=workers)
    for b, batch in zip(range(12), dl):
        assert np.array_equal(batch["input_ids"].numpy(), ref[b]), f"batch {b}"


def _batches_filter():
    import warnings
    warnings.filterwarnings("ignore", category=tokenfeed.PerformanceWarning)


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("steps", [0, 1, 2, 5])
def test_iterable_batches_resume_at_any_step(make_dataset, workers, steps):
    """start= may be any step's position, whatever num_workers: the DataLoader continues the stream."""
    _batches_filter()
    ds = make_dataset(n_docs=150)
    ref = loader_batches(ds, steps + 7)
    first = TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1, seed=3)
    tb = TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1, seed=3, start=first.position_after(steps))
    for b, batch in zip(range(steps, steps + 7), DataLoader(tb, batch_size=None, num_workers=workers)):
        assert np.array_equal(batch["input_ids"].numpy(), ref[b]), f"batch {b}"
        assert np.array_equal(batch["labels"][:, :-1].numpy(), ref[b][:, 1:])


def test_iterable_batches_start_checked_before_workers(make_dataset):
    ds = make_dataset(n_docs=50)
    with pytest.raises(ValueError, match="multiple of the global batch 8"):
        TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=2, seed=3, start=12)
    with pytest.raises(ValueError, match="seq_len"):  # a bad setting too: here, not in a worker
        TokenBatches(ds, seq_len=0, batch_size=B, rank=0, world_size=1)


def test_iterable_batches_per_step_settings_with_workers(make_dataset):
    """balance= and warmup_steps= act on each step. The batches are made by the consuming process's
    engine whatever the worker count, so they give the Loader's batches with any num_workers."""
    _batches_filter()
    ds = make_dataset(n_docs=300)
    per_step = [dict(balance="attention", balance_micro_batches=2, packing="best_fit", pad_id=0),
                dict(warmup_steps=4, warmup_min_seq_len=L // 4, cu_seqlens=True)]
    for kw in per_step:
        tb = TokenBatches(ds, seq_len=L, batch_size=B, rank=1, world_size=2, seed=3, **kw)
        ref = tokenfeed.Loader(ds, seq_len=L, batch_size=B, rank=1, world_size=2, seed=3, output="numpy", **kw)
        want = [{k: v.copy() for k, v in next(ref).items()} for _ in range(6)]
        for workers in (0, 1, 2):
            got = [b for _, b in zip(range(6), DataLoader(tb, batch_size=None, num_workers=workers))]
            for w, g in zip(want, got):
                assert set(w) == set(g) and all(np.array_equal(g[k].numpy(), v) for k, v in w.items()), workers


class _Wrapped(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Another dataset whose worker code uses TokenBatches' batches (here: keeps input_ids)."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        for batch in self.inner:
            yield batch["input_ids"] + 0


def test_iterable_batches_inside_another_dataset(make_dataset):
    """Wrapped in another dataset, TokenBatches gives that dataset's worker code real batches (each
    worker runs an engine over its share of the steps): the same stream; per-step settings, which
    that cannot honour with several workers, are refused there with what to do."""
    _batches_filter()
    ds = make_dataset(n_docs=150)
    ref = loader_batches(ds, 8)
    for workers in (0, 2):
        got = [b for _, b in zip(range(8), DataLoader(_Wrapped(TokenBatches(ds, seq_len=L, batch_size=B, rank=0,
                                                                            world_size=1, seed=3)),
                                                      batch_size=None, num_workers=workers))]
        assert all(np.array_equal(g.numpy(), r) for g, r in zip(got, ref)) and len(got) == 8, workers
    tb = TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1, seed=3, warmup_steps=4,
                      warmup_min_seq_len=L // 4)
    with pytest.raises(ValueError, match="warmup_steps= with num_workers=2.*Make TokenBatches the DataLoader's"):
        next(iter(DataLoader(_Wrapped(tb), batch_size=None, num_workers=2)))


def _keys(batch):
    return list(batch.keys())


def test_iterable_batches_collate_fn_in_a_worker_says_what_to_do(make_dataset):
    """With workers a batch is made in the consuming process: a collate_fn, which runs in the
    worker, is told so instead of failing on an unknown object."""
    ds = make_dataset(n_docs=50)
    dl = DataLoader(TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1), batch_size=None,
                    num_workers=1, collate_fn=_keys)
    with pytest.raises(TypeError, match="collate_fn or transform in your loop"):
        next(iter(dl))


def test_iterable_batches_are_made_in_the_consuming_process(make_dataset):
    """No batch crosses between processes: what the loop gets is the engine's memory here, not a
    tensor a worker moved into shared memory; out-of-order arrival from the workers still gives
    every batch of the stream."""
    _batches_filter()
    ds = make_dataset(n_docs=150)
    ref = loader_batches(ds, 12)
    tb = TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1, seed=3)
    for b, batch in zip(range(12), DataLoader(tb, batch_size=None, num_workers=2)):
        assert not batch["input_ids"].is_shared()
        assert np.array_equal(batch["input_ids"].numpy(), ref[b]), f"batch {b}"
    whole = [b["input_ids"].copy() for b in tokenfeed.Loader(ds, seq_len=L, batch_size=B, seed=3, epochs=1,
                                                             output="numpy")]
    tb = TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1, seed=3, epochs=1)
    got = [batch["input_ids"].numpy().copy() for batch in DataLoader(tb, batch_size=None, num_workers=3,
                                                                      in_order=False)]
    assert len(whole) > 6 and sorted(g.tobytes() for g in got) == sorted(w.tobytes() for w in whole)


def test_iterable_batches_held_by_the_consumer_stay_intact(make_dataset):
    """Batches the loop keeps stay intact while the engine goes on."""
    _batches_filter()
    ds = make_dataset(n_docs=300)
    ref = loader_batches(ds, 40)
    dl = DataLoader(TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1, seed=3), batch_size=None,
                    num_workers=2)
    kept = [batch for _, batch in zip(range(40), dl)]
    for b, batch in enumerate(kept):
        assert np.array_equal(batch["input_ids"].numpy(), ref[b]), f"batch {b}"
        assert batch["input_ids"].data_ptr() == batch["tokens"].data_ptr()  # still views of one buffer


@pytest.mark.parametrize("extras", [dict(position_ids=True, loss_mask=True),
                                    dict(cu_seqlens=True, position_ids=True, separator_id=0),
                                    dict(output="numpy", loss_mask=True)])
def test_iterable_batches_outputs_through_workers(make_dataset, extras):
    _batches_filter()
    ds = make_dataset(n_docs=150)
    kw = dict(seed=3, **extras)
    out = kw.get("output", "torch")
    kw.pop("output", None)
    ref = tokenfeed.Loader(ds, seq_len=L, batch_size=B, output="numpy", **kw)
    ref_batches = [{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in next(ref).items()}
                   for _ in range(6)]
    dl = DataLoader(TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1, output=out, **kw),
                    batch_size=None, num_workers=2)
    for want, got in zip(ref_batches, dl):
        assert set(got) == set(want)
        for k, v in want.items():
            g = got[k]
            if isinstance(v, np.ndarray):
                assert isinstance(g, np.ndarray if out == "numpy" else torch.Tensor)
                assert np.array_equal(np.asarray(g), v), k
            else:
                assert g == v, k


def test_iterable_batches_finite_epochs_with_persistent_workers(make_dataset):
    """A finite stream ends where the Loader's does, and a second pass over persistent workers
    gives it again (the consumer's engine goes back to the start)."""
    _batches_filter()
    ds = make_dataset(n_docs=40)
    ref = tokenfeed.Loader(ds, seq_len=L, batch_size=B, seed=3, epochs=1, output="numpy")
    want = [b["input_ids"].copy() for b in ref]
    assert len(want) > 3
    dl = DataLoader(TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1, seed=3, epochs=1),
                    batch_size=None, num_workers=2, persistent_workers=True)
    for _ in range(2):
        got = [b["input_ids"].numpy().copy() for b in dl]
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_iterable_batches_spawned_workers(make_dataset):
    _batches_filter()
    ds = make_dataset(n_docs=150)
    ref = loader_batches(ds, 8)
    tb = TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1, seed=3, start=2 * B)
    dl = DataLoader(tb, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    for b, batch in zip(range(2, 8), dl):
        assert np.array_equal(batch["input_ids"].numpy(), ref[b]), f"batch {b}"


def test_iterable_batches_with_workers_say_what_to_use(make_dataset):
    import tokenfeed.torch as tft

    ds = make_dataset(n_docs=50)
    tft._warned_workers = False
    dl = DataLoader(TokenBatches(ds, seq_len=L, batch_size=B, rank=0, world_size=1), batch_size=None, num_workers=1)
    with pytest.warns(tokenfeed.PerformanceWarning, match="num_workers=0"):
        next(iter(dl))


def test_loader_yields_torch_tensors_sharing_memory(make_dataset):
    ds = make_dataset()
    l = tokenfeed.Loader(ds, seq_len=L, batch_size=B, output="torch")
    batch = next(l)
    assert isinstance(batch["input_ids"], torch.Tensor) and batch["input_ids"].dtype == torch.int64
    assert batch["input_ids"].shape == (B, L)
    assert batch["input_ids"].data_ptr() == batch["tokens"].data_ptr()


def _child_iterates(loader, q):
    try:
        q.put([next(loader)["tokens"].copy() for _ in range(3)])
    except Exception as e:  # pragma: no cover - reported to the parent
        q.put(repr(e))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_loader_survives_fork_and_spawn(make_dataset, method):
    ds = make_dataset()
    ref = tokenfeed.Loader(ds, seq_len=L, batch_size=B, output="numpy", seed=1)
    expected = [next(ref)["tokens"].copy() for _ in range(5)]
    l = tokenfeed.Loader(ds, seq_len=L, batch_size=B, output="numpy", seed=1)
    first = next(l)["tokens"].copy()      # threads started in the parent
    assert np.array_equal(first, expected[0])
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_child_iterates, args=(l, q))
    p.start()
    got = q.get(timeout=120)
    p.join(60)
    assert p.exitcode == 0
    assert not isinstance(got, str), got
    # the child continues from the parent's position; the parent is unaffected
    for a, b in zip(got, expected[1:4]):
        assert np.array_equal(a, b)
    assert np.array_equal(next(l)["tokens"], expected[1])


TORCHRUN_SCRIPT = textwrap.dedent("""
    import sys, numpy as np, torch.distributed as dist, tokenfeed
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    ds = tokenfeed.open(sys.argv[1])
    l = tokenfeed.Loader(ds, seq_len=16, batch_size=3, seed=11, output="numpy")   # rank/world from torch.distributed
    assert (l.rank, l.world_size) == (r, w)
    np.save(f"{sys.argv[2]}/rank{r}.npy", np.stack([next(l)["tokens"].copy() for _ in range(6)]))
    dist.barrier()
    dist.destroy_process_group()
""")


def test_torchrun_two_ranks_partition_the_global_batches(make_dataset, tmp_path):
    ds = make_dataset(n_docs=200)
    script = tmp_path / "ranks.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script), ds.paths[0], str(tmp_path)], capture_output=True, text=True, timeout=180,
                       env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    r0, r1 = np.load(tmp_path / "rank0.npy"), np.load(tmp_path / "rank1.npy")
    single = tokenfeed.Loader(ds, seq_len=16, batch_size=6, seed=11, rank=0, world_size=1, output="numpy")
    for b in range(6):
        g = next(single)["tokens"]
        assert np.array_equal(np.concatenate([r0[b], r1[b]]), g)
        assert not {row.tobytes() for row in r0[b]} & {row.tobytes() for row in r1[b]}


def test_map_style_in_workers_says_what_to_use(make_dataset, monkeypatch):
    """TokenDataset read in a DataLoader worker says it is slower there, and what to use."""
    import tokenfeed.torch as tft

    td = TokenDataset(make_dataset(n_docs=50), seq_len=L)
    monkeypatch.setattr(tft, "get_worker_info", lambda: object())  # as inside a DataLoader worker
    with pytest.warns(tokenfeed.PerformanceWarning, match="use TokenBatches"):
        td[0]
