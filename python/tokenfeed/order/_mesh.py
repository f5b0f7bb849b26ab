"""Which data this rank receives under multi-dimensional parallelism.

Only two coordinates of a rank change what the loader gives it:

- its **data-parallel** rank and size: the DP ranks take disjoint slices of every global
  batch (``batch_size`` samples each, so the global batch is ``batch_size * dp_size``);
- its **context-parallel** rank and size: the ranks of a CP group share their DP rank's
  samples, and each takes its load-balanced share of every sample's sequence.

Every other dimension (tensor, pipeline, expert, ...) replicates: ranks that differ
only there receive identical batches. :func:`parallel_coords` finds the two coordinates
from a torch ``DeviceMesh`` (by dim name), from explicit numbers (no torch needed), or,
as before meshes existed, from the global rank and world size (right only for pure data
parallelism; see ``docs/guides/distributed.md``).
"""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Tuple

import numpy as np

__all__ = ["ParallelCoords", "parallel_coords", "DEFAULT_DP_DIMS", "DEFAULT_CP_DIM"]

#: Mesh dims whose coordinates together make the data-parallel rank (in mesh order).
#: torchtitan names them so (``dp`` is its flattened or unflattened data-loading dim).
DEFAULT_DP_DIMS: Tuple[str, ...] = ("dp", "dp_replicate", "dp_shard")
#: The context-parallel mesh dim.
DEFAULT_CP_DIM = "cp"

# Name fragments of dims that hold data parallelism under another name (torchtitan's
# dp_shard_cp / dp_cp / dp_shard_in_ep, "fsdp", "batch", ...). With the default dp_dims,
# a mesh with such a dim is refused rather than silently treated as replicating.
_DATA_LIKE = ("dp", "fsdp", "ddp", "hsdp", "zero", "data", "batch")


@dataclass(frozen=True)
class ParallelCoords:
    """This rank's place in the data: ``dp_rank`` of ``dp_size`` and ``cp_rank`` of ``cp_size``.

    ``source`` says where the numbers came from: ``"device_mesh"``, ``"explicit"``,
    ``"torch.distributed"``, ``"environment"`` (``RANK``/``WORLD_SIZE``) or
    ``"single process"``. ``replicated`` names the mesh dims that replicate (ranks that
    differ only there get identical batches); ``dp_dims`` the mesh dims that made the
    data-parallel rank.
    """

    dp_rank: int
    dp_size: int
    cp_rank: int = 0
    cp_size: int = 1
    source: str = "explicit"
    dp_dims: Tuple[str, ...] = field(default=())
    replicated: Tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.dp_size < 1 or not 0 <= self.dp_rank < self.dp_size:
            raise ValueError(f"need 0 <= dp_rank < dp_size, got dp_rank={self.dp_rank}, dp_size={self.dp_size}")
        if self.cp_size < 1 or not 0 <= self.cp_rank < self.cp_size:
            raise ValueError(f"need 0 <= cp_rank < cp_size, got cp_rank={self.cp_rank}, cp_size={self.cp_size}")


def _int(name: str, v: Any) -> Optional[int]:
    """Refuse floats, strings and bools where an int is meant (int() would convert them silently)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, not {type(v).__name__} ({v!r})")
    return int(v)


def _names(dims: Any, what: str) -> Tuple[str, ...]:
    if isinstance(dims, str):
        return (dims,)
    try:
        out = tuple(dims)
    except TypeError:
        raise TypeError(f"{what} must be a dim name or a sequence of dim names, got {dims!r}") from None
    if not all(isinstance(d, str) for d in out):
        raise TypeError(f"{what} must hold dim names (str), got {dims!r}")
    return out


def _from_mesh(mesh: Any, dp_dims: Tuple[str, ...], cp_dim: Optional[str], default_dims: bool) -> ParallelCoords:
    names = getattr(mesh, "mesh_dim_names", None)
    if names is None:
        raise ValueError("device_mesh has no dim names: build it with init_device_mesh(..., mesh_dim_names=(...)) "
                         "so that the data-parallel and context-parallel dims can be told apart")
    names = tuple(names)
    if cp_dim is not None and cp_dim in dp_dims:
        raise ValueError(f"dim {cp_dim!r} is named both in dp_dims and as cp_dim")
    coord = mesh.get_coordinate()
    if coord is None:
        raise ValueError(f"this rank is not part of device_mesh (dims {names}, shape {tuple(mesh.shape)}): pass the "
                         f"mesh that holds this rank")
    shape = tuple(int(s) for s in mesh.shape)
    if default_dims:
        odd = [n for n in names if n not in dp_dims and n != cp_dim and any(f in n.lower() for f in _DATA_LIKE)]
        if odd:
            raise ValueError(
                f"device_mesh dim(s) {odd} look data-parallel but are not among dp_dims={dp_dims}; they would "
                f"replicate (every rank along them would receive the same batches). Pass the mesh whose dims "
                f"separate data, context and model parallelism (torchtitan: the data-loading mesh with dims "
                f"('dp', 'cp', 'tp') or the world mesh ('dp_replicate', 'dp_shard', 'cp', 'tp')), or name the "
                f"data-parallel dims with dp_dims=(...).")
    dp_rank, dp_size, used = 0, 1, []
    for i, n in enumerate(names):  # row-major over the DP dims in mesh order, as DeviceMesh._flatten numbers them
        if n in dp_dims:
            dp_rank = dp_rank * shape[i] + int(coord[i])
            dp_size *= shape[i]
            used.append(n)
    cp_rank, cp_size = 0, 1
    if cp_dim is not None and cp_dim in names:
        i = names.index(cp_dim)
        cp_rank, cp_size = int(coord[i]), shape[i]
    replicated = tuple(n for n in names if n not in used and n != cp_dim)
    return ParallelCoords(dp_rank, dp_size, cp_rank, cp_size, "device_mesh", tuple(used), replicated)


def _megatron_model_parallel() -> Optional[Tuple[int, int, int]]:
    """(tp, pp, cp) sizes when Megatron's parallel_state is initialised with model parallelism, else None."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None:
        return None
    try:
        if not ps.model_parallel_is_initialized():
            return None
        tp = int(ps.get_tensor_model_parallel_world_size())
        pp = int(ps.get_pipeline_model_parallel_world_size())
        get_cp = getattr(ps, "get_context_parallel_world_size", None)
        cp = int(get_cp()) if get_cp is not None else 1
    except Exception:
        return None
    return (tp, pp, cp) if tp * pp * cp > 1 else None


def _from_world(rank: Optional[int], world_size: Optional[int]) -> ParallelCoords:
    """The default: torch.distributed's global rank and size, then RANK/WORLD_SIZE, then 0/1."""
    r: Optional[int] = None
    w: Optional[int] = None
    source = "single process"
    dist = sys.modules.get("torch.distributed")  # initialised only if torch was imported
    if dist is not None and dist.is_available() and dist.is_initialized():
        r, w, source = dist.get_rank(), dist.get_world_size(), "torch.distributed"
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        r, w, source = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "environment"
    else:
        r, w = 0, 1
    if rank is not None or world_size is not None:
        source = "explicit" if rank is not None and world_size is not None else source
    dp_rank = rank if rank is not None else r
    dp_size = world_size if world_size is not None else w
    if source in ("torch.distributed", "environment") and rank is None:
        mp = _megatron_model_parallel()
        if mp is not None:
            warnings.warn(
                f"tokenfeed: the data-parallel rank and size were taken from the global rank {dp_rank} and world "
                f"size {dp_size}, but Megatron's parallel_state has tensor/pipeline/context parallel sizes "
                f"{mp[0]}/{mp[1]}/{mp[2]}: tensor- and pipeline-parallel peers would get different batches. Pass "
                f"dp_rank=mpu.get_data_parallel_rank(), dp_size=mpu.get_data_parallel_world_size(), "
                f"cp_rank=mpu.get_context_parallel_rank(), cp_size=mpu.get_context_parallel_world_size() "
                f"(docs/guides/distributed.md).", stacklevel=4)
    return ParallelCoords(int(dp_rank), int(dp_size), 0, 1, source)


def parallel_coords(device_mesh: Any = None, *, dp_rank: Optional[int] = None, dp_size: Optional[int] = None,
                    cp_rank: Optional[int] = None, cp_size: Optional[int] = None, rank: Optional[int] = None,
                    world_size: Optional[int] = None, dp_dims: Sequence[str] = DEFAULT_DP_DIMS,
                    cp_dim: Optional[str] = DEFAULT_CP_DIM) -> ParallelCoords:
    """Resolve this rank's data-parallel and context-parallel coordinates.

    - ``device_mesh`` (a torch ``DeviceMesh`` with named dims): the DP rank is this
      rank's index over the dims named in ``dp_dims`` (row-major in mesh order, as
      ``DeviceMesh._flatten`` numbers them) and the DP size their product; the CP
      coordinate is the dim named ``cp_dim`` (``None``: no CP split, the dim
      replicates); every other dim replicates.
    - ``dp_rank``/``dp_size`` and ``cp_rank``/``cp_size``: explicit numbers, no torch
      needed. ``rank``/``world_size`` are the older names of ``dp_rank``/``dp_size``.
    - neither: ``torch.distributed``'s global rank and world size (then ``RANK`` /
      ``WORLD_SIZE``, then a single process) — right only for pure data parallelism
      (DDP, FSDP, HSDP); with tensor, pipeline or context parallelism pass a mesh or the
      data-parallel numbers.
    """
    dp_rank, dp_size = _int("dp_rank", dp_rank), _int("dp_size", dp_size)
    cp_rank, cp_size = _int("cp_rank", cp_rank), _int("cp_size", cp_size)
    rank, world_size = _int("rank", rank), _int("world_size", world_size)
    dims = _names(dp_dims, "dp_dims")
    if cp_dim is not None and not isinstance(cp_dim, str):
        raise TypeError(f"cp_dim must be a dim name or None, got {cp_dim!r}")
    if rank is not None and dp_rank is not None or world_size is not None and dp_size is not None:
        raise TypeError("rank/world_size are the older names of dp_rank/dp_size: give one or the other")
    if dp_rank is not None or dp_size is not None:
        if dp_rank is None or dp_size is None:
            raise TypeError("give dp_rank and dp_size together")
        rank, world_size = dp_rank, dp_size
    if (cp_rank is None) != (cp_size is None):
        raise TypeError("give cp_rank and cp_size together")
    if device_mesh is not None:
        given = [n for n, v in (("dp_rank", dp_rank), ("dp_size", dp_size), ("rank", rank), ("world_size", world_size),
                                ("cp_rank", cp_rank), ("cp_size", cp_size)) if v is not None]
        if given:
            raise TypeError(f"device_mesh= already gives the data-parallel and context-parallel coordinates; "
                            f"do not also pass {', '.join(given)}")
        return _from_mesh(device_mesh, dims, cp_dim, dims == DEFAULT_DP_DIMS)
    base = _from_world(rank, world_size)
    if cp_size is not None:
        return ParallelCoords(base.dp_rank, base.dp_size, int(cp_rank or 0), cp_size,
                              "explicit" if base.source == "explicit" else base.source)
    return base
