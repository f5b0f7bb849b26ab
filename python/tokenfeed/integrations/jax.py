"""Global ``jax.Array`` batches on several hosts, with the state kept by Orbax.

::

    import jax, orbax.checkpoint as ocp
    from jax.sharding import Mesh, PartitionSpec as P
    from tokenfeed.integrations.jax import GlobalBatches

    jax.distributed.initialize()                       # one process per host
    mesh = Mesh(np.array(jax.devices()).reshape(-1, 1), ("data", "model"))
    batches = GlobalBatches("data/train", mesh=mesh, spec=P("data"), seq_len=2048, global_batch_size=256)
    mgr = ocp.CheckpointManager("ckpt")
    if mgr.latest_step() is not None:
        batches.load_state_dict(mgr.restore(mgr.latest_step(), args=ocp.args.Composite(
            data=ocp.args.JsonRestore()))["data"])
    for step, batch in zip(range(start, steps), batches):   # batch["input_ids"]: global (256, 2048)
        state = train_step(state, batch["input_ids"], batch["labels"])
        mgr.save(step + 1, args=ocp.args.Composite(state=..., data=ocp.args.JsonSave(batches.state_dict())))

Each process runs one :class:`tokenfeed.Loader` that reads only the rows its devices hold:
which rows those are is read from the sharding (``spec`` over ``mesh``; the batch dimension
may be split over several mesh axes), so the processes together assemble global batch
``b`` = positions ``[b * G, (b + 1) * G)`` of tokenfeed's stream, whatever the mesh.
Each step's arrays are made with ``jax.make_array_from_process_local_data``. The state is a
small JSON-able dict, the same on every process: store it as an Orbax ``JsonSave`` item next
to the model state and it resumes the exact stream, on another number of hosts too.
Needs ``pip install jax``; see docs/guides/jax-cupy.md.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Sequence

import numpy as np

try:
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
except ImportError as e:  # pragma: no cover - exercised only without the package
    raise ImportError("tokenfeed.integrations.jax needs JAX: pip install jax") from e

from ..engine._loader import Loader

__all__ = ["GlobalBatches", "local_rows"]


def local_rows(sharding: Any, global_rows: int, seq_len: int) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of a ``(global_rows, seq_len)`` array that this process's devices
    hold under ``sharding``; a ValueError if they are not one contiguous block."""
    idx = sharding.addressable_devices_indices_map((global_rows, seq_len))
    spans = sorted({(s[0].start or 0, global_rows if s[0].stop is None else s[0].stop) for s in idx.values()})
    lo, hi = spans[0][0], spans[0][1]
    for a, b in spans[1:]:
        if a > hi:
            raise ValueError(f"this process's devices hold rows {spans} of the global batch, not one contiguous "
                             f"block: order the mesh's devices by process (jax.devices() order does)")
        hi = max(hi, b)
    return lo, hi


class GlobalBatches:
    """Iterate dicts of global ``jax.Array`` (``keys``, default ``input_ids`` and ``labels``,
    each ``(global_batch_size, seq_len)``) sharded by ``spec`` over ``mesh``.

    ``dataset`` and ``loader_kwargs`` go to :class:`tokenfeed.Loader` (``seed``,
    ``shuffle``, ``packing``, ``position_ids=True`` to add ``position_ids`` to ``keys``, ...).
    """

    def __init__(self, dataset: Any, *, mesh: Mesh, spec: PartitionSpec, seq_len: int, global_batch_size: int,
                 keys: Sequence[str] = ("input_ids", "labels"), **loader_kwargs: Any) -> None:
        self.sharding = NamedSharding(mesh, spec)
        self.keys = tuple(keys)
        lo, hi = local_rows(self.sharding, global_batch_size, seq_len)
        per = hi - lo
        if global_batch_size % per or lo % per:
            raise ValueError(f"this process holds rows [{lo}, {hi}) of {global_batch_size}: the rows of every "
                             f"process must be an equal, aligned share of the global batch")
        self.global_batch_size = global_batch_size
        self.seq_len = seq_len
        loader_kwargs.setdefault("output", "numpy")
        self.loader = Loader(dataset, seq_len=seq_len, batch_size=per, dp_rank=lo // per,
                             dp_size=global_batch_size // per, **loader_kwargs)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self

    def __next__(self) -> Dict[str, Any]:
        b = next(self.loader)
        shape = (self.global_batch_size, self.seq_len)
        return {k: jax.make_array_from_process_local_data(self.sharding, np.asarray(b[k]), shape)
                for k in self.keys}

    def state_dict(self) -> Dict[str, Any]:
        """The Loader's state: the same on every process (positions are global)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)
