"""One rank of the torchrun runs of test_mesh_torchrun.py (gloo, CPU).

    python -m torch.distributed.run --nproc-per-node 4 ... mesh_worker.py DATA OUT SEQ_LEN GLOBAL_BATCH STEPS

Each scenario builds a DeviceMesh over the 4 processes, feeds a Loader through it and
saves what this rank received to OUT/<scenario>.<rank>.npz; the test compares the ranks'
files with one another and with a one-process Loader.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import tokenfeed


def take(loader, n):
    out = {}
    for _ in range(n):
        b = next(loader)
        for k, v in b.items():
            out.setdefault(k, []).append(np.asarray(v).copy())
    return {k: np.stack(v) for k, v in out.items()}


def pc_of(mesh):
    return tokenfeed.parallel_coords(mesh)


def main() -> None:
    data, out_dir, seq_len, G, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, world
    ds = tokenfeed.open(data)
    common = dict(seq_len=seq_len, seed=7, output="numpy", num_threads=1, position_ids=True, loss_mask=True)

    def save(name, arrays, **meta):
        np.savez(os.path.join(out_dir, f"{name}.{rank}.npz"), meta=json.dumps(meta), **arrays)

    # (dp=2, tp=2): tp peers identical, dp ranks disjoint
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    loader = tokenfeed.Loader(ds, batch_size=G // 2, device_mesh=mesh, **common)
    save("dp2tp2", take(loader, steps), dp_rank=loader.dp_rank, dp_size=loader.dp_size,
         coord=list(mesh.get_coordinate()))
    loader.close()

    # HSDP-style (dp_replicate=2, dp_shard=2): the DP rank is DeviceMesh's own flattening
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    flat = mesh["dp_replicate", "dp_shard"]._flatten("dp")
    pc = tokenfeed.parallel_coords(mesh)
    save("hsdp", {}, dp_rank=pc.dp_rank, dp_size=pc.dp_size, flat_rank=flat.get_local_rank(), flat_size=flat.size())

    # (dp=2, cp=2): each CP rank its load-balanced share of its DP rank's samples, plain and THD
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "cp"))
    loader = tokenfeed.Loader(ds, batch_size=G // 2, device_mesh=mesh, **common)
    save("dp2cp2", take(loader, steps), dp_rank=loader.dp_rank, cp_rank=loader.cp_rank, cp_size=loader.cp_size)
    loader.close()
    loader = tokenfeed.Loader(ds, batch_size=G // 2, device_mesh=mesh, cu_seqlens=True, **common)
    thd = [next(loader) for _ in range(steps)]
    loader.close()
    save("dp2cp2_thd", {f"{k}.{i}": np.asarray(b[k]) for i, b in enumerate(thd) for k in b},
         dp_rank=pc_of(mesh).dp_rank, cp_rank=pc_of(mesh).cp_rank,
         ints=[{k: int(v) for k, v in b.items() if not isinstance(v, np.ndarray)} for b in thd])

    # a state saved at dp=4 resumes at (dp=2, tp=2) with the same global batch
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    loader = tokenfeed.Loader(ds, batch_size=G // 4, device_mesh=mesh, **common)
    before = take(loader, steps)
    state = loader.state_dict()
    loader.close()
    states = [None] * world
    dist.all_gather_object(states, state)
    assert all(s == states[0] for s in states), "every rank saves the same state"
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    loader = tokenfeed.Loader(ds, batch_size=G // 2, device_mesh=mesh, **common)
    loader.load_state_dict(json.loads(json.dumps(states[0])))  # through JSON, as a checkpoint would
    after = take(loader, steps)
    save("resume_before", before, dp_rank=rank, dp_size=4)
    save("resume_after", after, dp_rank=loader.dp_rank, dp_size=loader.dp_size, position=state["position"])
    loader.close()

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
