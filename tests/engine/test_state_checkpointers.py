"""The loader state through every checkpointer a trainer uses.

``torch.distributed.checkpoint`` (DCP) loads a ``Stateful`` by asking the freshly built
destination for its ``state_dict()`` and filling only the keys found there; nested dicts
are traversed key by key. So a state must have the same keys whatever the loader went
through (a re-weighted mixture's hand-over anchor is ``None`` on a fresh loader, not
missing) and leaves DCP keeps (ints, strings, ``None``, lists). Every kind of state is
saved from a loader part-way through its stream and loaded into a freshly built one,
which must continue with exactly the batches the saved loader went on to deliver: in one
process and over two (gloo), onto another world size, and through ``torch.save`` and JSON.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

import tokenfeed

SEQ = 16
KINDS = ["reweighted", "plain", "mixture", "schedule", "best_fit_block", "cp", "live", "skipped"]


def make_data(root: Path) -> List[Any]:
    rng = np.random.default_rng(0)
    out = []
    for name, n in (("a", 300), ("b", 120)):
        with tokenfeed.DatasetWriter(root / name, vocab_size=1000) as w:
            for _ in range(n):
                w.add_document(rng.integers(0, 990, size=int(rng.integers(1, 60))))
        out.append(root / name)
    return out


def build(kind: str, paths: List[Path], rank: int = 0, world: int = 1, global_batch: int = 4,
          fresh: bool = False) -> tokenfeed.Loader:
    """A loader of the kind. A "reweighted" one is a 70/30 mixture resumed under 40/60 (it
    carries a hand-over anchor); ``fresh`` gives the same settings without that history."""
    a, b = (tokenfeed.open(p) for p in paths)
    kw: Dict[str, Any] = dict(seq_len=SEQ, batch_size=global_batch // world, dp_rank=rank, dp_size=world,
                              seed=3, output="numpy", num_threads=1)
    if kind == "plain":
        return tokenfeed.Loader(a, **kw)
    if kind == "best_fit_block":
        return tokenfeed.Loader(a, packing="best_fit", pad_id=999, shuffle="block", block_size=7, window_blocks=3,
                                **kw)
    if kind == "cp":  # two context-parallel ranks share one data-parallel rank's samples
        kw.update(batch_size=global_batch, dp_rank=0, dp_size=1, cp_rank=rank, cp_size=world, position_ids=True)
        return tokenfeed.Loader(a, **kw)
    if kind == "mixture":
        return tokenfeed.Loader([a, b], weights=[0.7, 0.3], **kw)
    if kind == "schedule":
        sched = tokenfeed.WeightSchedule([(0, [0.9, 0.1]), (4, [0.2, 0.8])], interpolation="linear")
        return tokenfeed.Loader([a, b], weights=sched, mix_window=10, **kw)
    if kind == "skipped":  # the data of steps 3 and 4 left out, recorded before reaching them
        ld = tokenfeed.Loader(a, **kw)
        if not fresh:
            take(ld, 1)
            ld.skip_steps(3, 5)
        return ld
    if kind == "live":  # a 70/30 mixture given 20/80 by set_weights after two batches
        ld = tokenfeed.Loader([a, b], weights=[0.7, 0.3], **kw)
        if not fresh:
            take(ld, 2)
            ld.set_weights([0.2, 0.8])
        return ld
    assert kind == "reweighted"
    ld = tokenfeed.Loader([a, b], weights=[0.4, 0.6], **kw)
    if not fresh:
        old = tokenfeed.Loader([a, b], weights=[0.7, 0.3], **kw)
        take(old, 3)
        ld.load_state_dict(old.state_dict(), strict=False)
        old.close()
    return ld


def take(loader: tokenfeed.Loader, n: int) -> List[Dict[str, np.ndarray]]:
    return [{k: np.array(v) for k, v in next(loader).items()} for _ in range(n)]


def same(x: List[Dict[str, np.ndarray]], y: List[Dict[str, np.ndarray]]) -> bool:
    return len(x) == len(y) and all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
                                    for a, b in zip(x, y))


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> List[Path]:
    return make_data(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A one-process gloo group, as a trainer has when it checkpoints with DCP."""
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_state_keys_do_not_depend_on_history(paths):
    ld, fresh = build("reweighted", paths), build("reweighted", paths, fresh=True)
    s, f = ld.state_dict(), fresh.state_dict()
    assert s["mix_anchor"] is not None and f["mix_anchor"] is None

    def keys(d: Any, pre: str = "") -> List[str]:
        return sorted(k2 for k, v in d.items() for k2 in (keys(v, f"{pre}{k}.") if isinstance(v, dict) else [pre + k]))

    assert keys(s) == keys(f)
    live = build("live", paths).state_dict()
    assert live["weights_history"] == [[8, [0.2, 0.8]]] and f["weights_history"] is None
    skipped = build("skipped", paths).state_dict()
    assert skipped["skipped"] == [[12, 20]] and f["skipped"] is None
    for st in (s, f, live, skipped, build("plain", paths).state_dict(), build("schedule", paths).state_dict()):
        assert keys(st) == keys(f)  # one set of keys for every kind of loader
        for v in [x for x in st.values() if not isinstance(x, dict)] + list(st["config"].values()):
            assert v is None or isinstance(v, (int, float, str, list)), v


@pytest.mark.parametrize("kind", KINDS)
def test_dcp_round_trip_into_a_fresh_loader(paths, group, tmp_path, kind):
    ld = build(kind, paths)
    take(ld, 2)
    dcp.save({"loader": ld}, checkpoint_id=str(tmp_path / "ckpt"))
    saved_at, saved = ld.position, ld.state_dict()
    want = take(ld, 5)
    fresh = build(kind, paths, fresh=True)
    dcp.load({"loader": fresh}, checkpoint_id=str(tmp_path / "ckpt"))
    assert fresh.position == saved_at
    # the weights a live mixture began with come back too (explain tells the steps before a change from them)
    assert fresh.state_dict()["weights_initial"] == saved["weights_initial"]
    assert same(take(fresh, 5), want)


@pytest.mark.parametrize("kind", KINDS)
def test_torch_save_and_json_round_trips(paths, tmp_path, kind):
    ld = build(kind, paths)
    take(ld, 3)
    state = ld.state_dict()
    torch.save({"loader": state}, tmp_path / "s.pt")
    (tmp_path / "s.json").write_text(json.dumps(state))
    want = take(ld, 4)
    for got in (torch.load(tmp_path / "s.pt", weights_only=True)["loader"], json.loads((tmp_path / "s.json").read_text())):
        fresh = build(kind, paths, fresh=True)
        fresh.load_state_dict(got)
        assert same(take(fresh, 4), want), kind


def _rank_main(rank: int, world: int, root: str, kind: str) -> None:
    """One rank: save through DCP part-way, note the next batches, then load the checkpoint
    into a freshly built loader and note what it delivers."""
    dist.init_process_group("gloo", init_method=f"file://{root}/store-{kind}", rank=rank, world_size=world)
    try:
        paths = [Path(root) / "a", Path(root) / "b"]
        ckpt = os.path.join(root, f"ckpt-{kind}")
        for phase in ("save", "load"):
            ld = build(kind, paths, rank=rank, world=world, fresh=phase == "load")
            if phase == "save":
                take(ld, 2)
                dcp.save({"loader": ld}, checkpoint_id=ckpt)
            else:
                dcp.load({"loader": ld}, checkpoint_id=ckpt)
            got = take(ld, 4)
            np.savez(os.path.join(root, f"{kind}-{phase}-{rank}.npz"),
                     **{f"{i}.{k}": v for i, b in enumerate(got) for k, v in b.items()})
            ld.close()
    finally:
        dist.destroy_process_group()


def _load_rank(root: Path, kind: str, phase: str, rank: int) -> List[Dict[str, np.ndarray]]:
    z = np.load(root / f"{kind}-{phase}-{rank}.npz")
    out: List[Dict[str, np.ndarray]] = [{} for _ in range(4)]
    for key in z.files:
        i, k = key.split(".", 1)
        out[int(i)][k] = z[key]
    return out


@pytest.mark.parametrize("kind", ["reweighted", "schedule", "cp"])
def test_dcp_two_processes_and_elastic(group, tmp_path, kind):
    """Two ranks save through DCP; two fresh ranks resume their own slices, and one process
    with the whole global batch resumes the same global stream (not for CP: the ranks
    there split samples, not batches)."""
    make_data(tmp_path)
    mp.spawn(_rank_main, args=(2, str(tmp_path), kind), nprocs=2, join=True)
    for r in range(2):
        assert same(_load_rank(tmp_path, kind, "load", r), _load_rank(tmp_path, kind, "save", r)), (kind, r)
    if kind == "cp":
        return
    one = build(kind, [tmp_path / "a", tmp_path / "b"], fresh=True)  # one process, the whole global batch
    dcp.load({"loader": one}, checkpoint_id=str(tmp_path / f"ckpt-{kind}"))
    got = take(one, 4)
    halves = [_load_rank(tmp_path, kind, "save", r) for r in range(2)]
    for i, b in enumerate(got):
        for k, v in b.items():
            assert np.array_equal(v, np.concatenate([halves[0][i][k], halves[1][i][k]])), (kind, i, k)
