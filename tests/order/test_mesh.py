"""Which part of the data a rank takes: data-parallel and context-parallel coordinates from a
DeviceMesh (by dim name) or explicit numbers, every other dim replicating; and the
context-parallel reference layouts the Loader's CP output is checked against.

The multi-process checks (real DeviceMesh under torchrun) are in test_mesh_torchrun.py.
"""
from __future__ import annotations

import itertools
import sys
import types
import warnings

import numpy as np
import pytest

import tokenfeed
from tokenfeed import ParallelCoords, parallel_coords

import cp_reference as ref


class FakeMesh:
    """The part of torch's DeviceMesh that parallel_coords reads: names, shape, this rank's coordinate."""

    def __init__(self, shape, names, coord):
        self.shape = tuple(shape)
        self.mesh_dim_names = None if names is None else tuple(names)
        self._coord = None if coord is None else list(coord)

    def get_coordinate(self):
        return self._coord


def all_coords(shape):
    return list(itertools.product(*[range(s) for s in shape]))


# --------------------------------------------------------------------------- meshes

def test_dp_tp_mesh_tp_peers_share_dp_rank():
    shape, names = (2, 2), ("dp", "tp")
    got = {c: parallel_coords(FakeMesh(shape, names, c)) for c in all_coords(shape)}
    for (d, t), pc in got.items():
        assert (pc.dp_rank, pc.dp_size, pc.cp_rank, pc.cp_size) == (d, 2, 0, 1)
        assert pc.source == "device_mesh" and pc.dp_dims == ("dp",) and pc.replicated == ("tp",)


@pytest.mark.parametrize("names", [("pp", "dp_replicate", "dp_shard", "cp", "tp"),
                                   ("dp_replicate", "pp", "cp", "dp_shard", "tp")])
def test_dp_rank_is_row_major_over_dp_dims_in_mesh_order(names):
    shape = (2, 3, 2, 2, 2)
    sizes = dict(zip(names, shape))
    seen = {}
    for c in all_coords(shape):
        pc = parallel_coords(FakeMesh(shape, names, c))
        at = dict(zip(names, c))
        dp_names = [n for n in names if n in ("dp_replicate", "dp_shard")]
        expect = at[dp_names[0]] * sizes[dp_names[1]] + at[dp_names[1]]   # DeviceMesh._flatten numbering
        assert (pc.dp_rank, pc.dp_size) == (expect, sizes["dp_replicate"] * sizes["dp_shard"])
        assert (pc.cp_rank, pc.cp_size) == (at["cp"], 2)
        assert set(pc.replicated) == {"pp", "tp"}
        seen.setdefault((pc.dp_rank, pc.cp_rank), set()).add((at["pp"], at["tp"]))
    # every (dp, cp) pair is held by exactly the pp x tp replicas
    dp = sizes["dp_replicate"] * sizes["dp_shard"]
    assert len(seen) == dp * sizes["cp"] and all(len(v) == sizes["pp"] * sizes["tp"] for v in seen.values())


def test_cp_dim_none_replicates_cp_and_custom_names():
    pc = parallel_coords(FakeMesh((2, 2), ("dp", "cp"), (1, 1)), cp_dim=None)
    assert (pc.dp_rank, pc.dp_size, pc.cp_rank, pc.cp_size, pc.replicated) == (1, 2, 0, 1, ("cp",))
    pc = parallel_coords(FakeMesh((4, 2, 2), ("data", "seq", "model"), (3, 1, 0)), dp_dims=("data",), cp_dim="seq")
    assert (pc.dp_rank, pc.dp_size, pc.cp_rank, pc.cp_size, pc.replicated) == (3, 4, 1, 2, ("model",))
    pc = parallel_coords(FakeMesh((4,), ("tp",), (2,)))       # pure tensor parallelism: one DP rank
    assert (pc.dp_rank, pc.dp_size, pc.replicated) == (0, 1, ("tp",))


@pytest.mark.parametrize("dim", ["dp_shard_cp", "dp_cp", "fsdp", "batch", "dp_shard_in_ep"])
def test_data_like_dims_outside_dp_dims_are_refused(dim):
    mesh = FakeMesh((2, 2), (dim, "tp"), (0, 1))
    with pytest.raises(ValueError, match=f"{dim}.*look data-parallel"):
        parallel_coords(mesh)
    # naming the data-parallel dims takes responsibility for them
    assert parallel_coords(mesh, dp_dims=(dim,)).dp_size == 2


def test_mesh_errors():
    with pytest.raises(ValueError, match="no dim names"):
        parallel_coords(FakeMesh((2,), None, (0,)))
    with pytest.raises(ValueError, match="not part of device_mesh"):
        parallel_coords(FakeMesh((2, 2), ("dp", "tp"), None))
    with pytest.raises(ValueError, match="both in dp_dims and as cp_dim"):
        parallel_coords(FakeMesh((2,), ("dp",), (0,)), cp_dim="dp")
    with pytest.raises(TypeError, match="do not also pass dp_rank, dp_size"):
        parallel_coords(FakeMesh((2,), ("dp",), (0,)), dp_rank=0, dp_size=2)
    with pytest.raises(TypeError, match="do not also pass cp_rank, cp_size"):
        parallel_coords(FakeMesh((2,), ("dp",), (0,)), cp_rank=0, cp_size=2)
    with pytest.raises(TypeError, match="dp_dims"):
        parallel_coords(FakeMesh((2,), ("dp",), (0,)), dp_dims=[1])


# --------------------------------------------------------------------------- explicit and default

def test_explicit_numbers_without_torch():
    assert parallel_coords(dp_rank=3, dp_size=4, cp_rank=1, cp_size=2) == ParallelCoords(3, 4, 1, 2, "explicit")
    assert parallel_coords(rank=1, world_size=2) == ParallelCoords(1, 2, 0, 1, "explicit")
    assert parallel_coords(dp_rank=np.int64(1), dp_size=np.int32(2)).dp_rank == 1
    with pytest.raises(TypeError, match="older names"):
        parallel_coords(rank=0, dp_rank=0, dp_size=1)
    with pytest.raises(TypeError, match="together"):
        parallel_coords(dp_rank=0)
    with pytest.raises(TypeError, match="together"):
        parallel_coords(cp_size=2)
    with pytest.raises(TypeError, match="must be an int"):
        parallel_coords(dp_rank=0.0, dp_size=2)
    with pytest.raises(TypeError, match="must be an int"):
        parallel_coords(cp_rank="0", cp_size=2)
    with pytest.raises(ValueError, match="0 <= dp_rank < dp_size"):
        parallel_coords(dp_rank=2, dp_size=2)
    with pytest.raises(ValueError, match="0 <= cp_rank < cp_size"):
        parallel_coords(cp_rank=0, cp_size=0)


def test_default_is_the_global_rank(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if "torch.distributed" in sys.modules:
        monkeypatch.setattr(sys.modules["torch.distributed"], "is_initialized", lambda: False)
    assert parallel_coords() == ParallelCoords(0, 1, 0, 1, "single process")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert parallel_coords() == ParallelCoords(3, 8, 0, 1, "environment")
    assert parallel_coords(cp_rank=1, cp_size=2) == ParallelCoords(3, 8, 1, 2, "environment")
    assert parallel_coords(rank=1) == ParallelCoords(1, 8, 0, 1, "environment")


def test_default_warns_under_megatron_model_parallelism(monkeypatch):
    """The global rank is wrong under tensor parallelism: with Megatron's parallel_state initialised
    with TP 2, the default says so and names the mpu calls to use."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    if "torch.distributed" in sys.modules:
        monkeypatch.setattr(sys.modules["torch.distributed"], "is_initialized", lambda: False)
    ps = types.ModuleType("megatron.core.parallel_state")
    ps.model_parallel_is_initialized = lambda: True  # type: ignore[attr-defined]
    ps.get_tensor_model_parallel_world_size = lambda: 2  # type: ignore[attr-defined]
    ps.get_pipeline_model_parallel_world_size = lambda: 1  # type: ignore[attr-defined]
    ps.get_context_parallel_world_size = lambda: 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", ps)
    with pytest.warns(UserWarning, match=r"tensor/pipeline/context parallel sizes 2/1/1.*get_data_parallel_rank"):
        pc = parallel_coords()
    assert (pc.dp_rank, pc.dp_size) == (3, 8)   # the default itself is unchanged
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parallel_coords(dp_rank=1, dp_size=4)     # explicit numbers: no warning
        ps.get_tensor_model_parallel_world_size = lambda: 1  # type: ignore[attr-defined]
        parallel_coords()                         # pure data parallelism: no warning


def test_exported():
    assert tokenfeed.parallel_coords is parallel_coords
    assert "parallel_coords" in tokenfeed.__all__ and "ParallelCoords" in tokenfeed.__all__


# --------------------------------------------------------------------------- CP reference layouts

def test_megatron_split_matches_published_examples():
    # Megatron-Core's comment: "Assuming CP=2, we then get 4 chunks, chunk_0 and chunk_3 are
    # assigned to GPU0, chunk_1 and chunk_2 are assigned to GPU1"
    x = np.arange(16)[None, :]
    assert ref.megatron_cp_split(x, 2, 0).tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]
    assert ref.megatron_cp_split(x, 2, 1).tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    # S = 8192, CP = 4: rank 0 takes [0, 1024) and [7168, 8192), rank 3 [3072, 4096) and [4096, 5120)
    x = np.arange(8192)[None, :]
    r0, r3 = ref.megatron_cp_split(x, 4, 0)[0], ref.megatron_cp_split(x, 4, 3)[0]
    assert (r0 == np.r_[0:1024, 7168:8192]).all() and (r3 == np.r_[3072:5120]).all()
    parts = [ref.megatron_cp_split(np.arange(48).reshape(2, 24), 3, r) for r in range(3)]
    assert (ref.megatron_cp_unsplit(parts) == np.arange(48).reshape(2, 24)).all()


def test_megatron_split_matches_torch_head_tail_load_balancer():
    """PyTorch's context-parallel head-tail balancer is a third implementation of the same layout."""
    torch = pytest.importorskip("torch")
    lb_mod = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")
    for seq, cp in [(8, 4), (16, 2), (48, 3), (64, 8)]:
        idx = lb_mod._HeadTailLoadBalancer(seq, cp, torch.device("cpu"))._generate_indices().reshape(-1).numpy()
        mine = np.concatenate([ref.megatron_cp_split(np.arange(seq)[None, :], cp, r)[0] for r in range(cp)])
        assert (idx == mine).all(), (seq, cp)
    # the docstring's example: 8 positions over 4 ranks
    assert np.concatenate([ref.megatron_cp_split(np.arange(8)[None], 4, r)[0] for r in range(4)]).tolist() == \
        [0, 7, 1, 6, 2, 5, 3, 4]


def test_te_thd_reference_matches_published_example():
    # TransformerEngine's own THD test data: sequences of 7, 11 and 5 tokens, cp = 2
    cu = [0, 7, 18, 23]
    ids = np.array([1] * 7 + [2] * 11 + [3] * 5)
    padded, cu_pad = ref.te_pad_thd(ids, cu, 4, pad_value=1)
    assert cu_pad.tolist() == [0, 8, 20, 28]
    assert padded.tolist() == [1] * 7 + [1] + [2] * 11 + [1] + [3] * 5 + [1, 1, 1]
    assert ref.te_positions_thd(cu, 4).tolist() == list(range(8)) + list(range(12)) + list(range(8))
    # rank r of each padded sequence: chunks r and 3 - r of its 4 chunks
    r0 = ref.te_thd_partitioned_indices(cu_pad, 28, 2, 0).tolist()
    r1 = ref.te_thd_partitioned_indices(cu_pad, 28, 2, 1).tolist()
    assert r0 == [0, 1, 6, 7, 8, 9, 10, 17, 18, 19, 20, 21, 26, 27]
    assert r1 == [2, 3, 4, 5, 11, 12, 13, 14, 15, 16, 22, 23, 24, 25]
    assert sorted(r0 + r1) == list(range(28))
    # a single sequence is the Megatron split of it
    for cp in (1, 2, 4):
        for r in range(cp):
            idx = ref.te_thd_partitioned_indices([0, 32], 32, cp, r)
            assert (idx == ref.megatron_cp_split(np.arange(32)[None], cp, r)[0]).all()


def test_thd_layout_reference_round_trips():
    rng = np.random.default_rng(0)
    L, rows = 24, 3
    tokens = rng.integers(5, 100, size=(rows, L + 1))
    cu = np.full((rows, L + 1), L, dtype=np.int32)
    ns = np.zeros(rows, dtype=np.int32)
    for r in range(rows):
        starts = sorted(rng.choice(np.arange(1, L), size=r + 1, replace=False).tolist())
        cu[r, :len(starts) + 1] = [0] + starts
        ns[r] = len(starts) + 1
    batch = {"tokens": tokens, "cu_seqlens": cu, "num_seqs": ns, "loss_mask": np.ones((rows, L), np.uint8)}
    cp = 2
    parts = [ref.thd_layout(batch, cp, r, pad_id=0) for r in range(cp)]
    assert all((p["cu_seqlens_padded"] == parts[0]["cu_seqlens_padded"]).all() for p in parts)
    cu_pad = parts[0]["cu_seqlens_padded"]
    whole = ref.thd_unsplit([p["input_ids"] for p in parts], cu_pad)
    cu_real = parts[0]["cu_seqlens"]
    # every sequence's real tokens, in order, are the rows' input ids end to end
    real = np.concatenate([whole[cu_pad[j]:cu_pad[j] + cu_real[j + 1] - cu_real[j]] for j in range(len(cu_real) - 1)])
    assert (real == tokens[:, :-1].reshape(-1)).all()
    assert len(parts[0]["input_ids"]) == len(parts[1]["input_ids"]) == cu_pad[-1] // cp
