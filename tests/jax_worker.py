"""One JAX process of tests/integrations/test_jax.py: PROCESS NPROC PORT DATA CKPT OUT STEPS.

Runs tokenfeed.integrations.jax.GlobalBatches over a 1-D data mesh of every process's CPU
device, resuming from the latest Orbax checkpoint in CKPT if there is one, and saves the
Loader state with Orbax after step 3. Writes the rows of each step's global input_ids that
this process holds (its addressable shards) to OUT."""
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

import tokenfeed  # noqa: E402
from tokenfeed.integrations.jax import GlobalBatches  # noqa: E402


def main(pid, nproc, port, data, ckpt, out, steps):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid,
                               initialization_timeout=60)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    batches = GlobalBatches(tokenfeed.open(data, dtype="uint16", eos_id=0), mesh=mesh, spec=P("data"), seq_len=32,
                            global_batch_size=8, seed=3, num_threads=1)
    mgr = ocp.CheckpointManager(ckpt)
    start = mgr.latest_step() or 0
    if start:
        restored = mgr.restore(start, args=ocp.args.Composite(data=ocp.args.JsonRestore()))
        batches.load_state_dict(restored["data"])
    rows, shapes = [], []
    for step in range(start, steps):
        x = next(batches)["input_ids"]
        shapes.append(x.shape)
        shard = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
        rows.append(np.concatenate([np.asarray(s.data) for s in shard]))
        if step + 1 == 3:
            mgr.save(3, args=ocp.args.Composite(data=ocp.args.JsonSave(batches.state_dict())))
    mgr.wait_until_finished()
    np.savez(out, rows=np.stack(rows), shapes=np.array(shapes), start=start)
    mgr.close()
    jax.distributed.shutdown()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), a[2], a[3], a[4], a[5], int(a[6]))
