"""Provenance of a step's batch, and the data-wait meter.

The order is a pure function of (configuration, position), so which documents made any
step is computed, never recorded: :meth:`Loader.explain` asks the C order layer for the
segments of each row (``tf_order_segments_at``: no tokens are read, the cost is the same at
step 10 and at step 10**9), and :meth:`Loader.where` for the steps that hold a document.

The meter is timed in C where the consumer waits (the engine's ``next()``, or the device
stage's with ``device="cuda"``); :func:`meter_verdict` turns its numbers into one line,
and :func:`meter_all_ranks` gathers them over a process group.
"""
from __future__ import annotations

import bisect
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, overload

from ..common._errors import StateError

# The functions take a Loader (typed Any: _loader imports this module, not the reverse).
_LoaderT = Any

__all__ = ["Segment", "meter_all_ranks", "meter_verdict"]

# positions are 64-bit: an endless stream's num_positions is this, the last one a step can reach
_LAST_POSITION = (1 << 64) - 1

# below this fraction of wall time waiting, data is not what limits the step
_OK_FRACTION = 0.02


class _Item:
    """Item ``index`` of a tuple of ints as a read-only attribute."""

    def __init__(self, index: int, doc: str) -> None:
        self.index = index
        self.__doc__ = doc

    @overload
    def __get__(self, obj: None, owner: Any = None) -> "_Item": ...
    @overload
    def __get__(self, obj: Tuple[int, ...], owner: Any = None) -> int: ...

    def __get__(self, obj: Optional[Tuple[int, ...]], owner: Any = None) -> Union[int, "_Item"]:
        return self if obj is None else obj[self.index]

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError("can't set attribute: a Segment's fields are its tuple's items")


class Segment(Tuple[int, int, int, int]):
    """One piece of a row: tokens ``[start, stop)`` of document ``document`` of dataset ``source``.

    A tuple ``(source, document, start, stop)``; ``source`` is the index of the dataset among
    the loader's datasets (0 for one dataset), ``document`` its index in that dataset,
    ``start``/``stop`` token offsets within the document. ``offset`` (an attribute, not part
    of the tuple) is where the piece begins in the row (0 .. ``seq_len``): the row's tokens
    that no segment covers are separators (with ``separator_id``) or padding
    (``best_fit``, ``document``).
    """

    offset: int
    #: the document's metadata, ``{column: value}``, when explain was asked for columns (else None)
    meta: Optional[Dict[str, Any]]

    def __new__(cls, source: int, document: int, start: int, stop: int, offset: int = 0,
                meta: Optional[Dict[str, Any]] = None) -> "Segment":
        self = super().__new__(cls, (source, document, start, stop))
        self.offset = offset
        self.meta = meta
        return self

    source = _Item(0, "index of the dataset among the loader's datasets")
    document = _Item(1, "index of the document in its dataset")
    start = _Item(2, "first token of the piece within the document")
    stop = _Item(3, "token after the last token of the piece within the document")

    def __len__(self) -> int:
        return 4

    @property
    def num_tokens(self) -> int:
        return self[3] - self[2]

    def __repr__(self) -> str:
        return (f"Segment(source={self[0]}, document={self[1]}, start={self[2]}, stop={self[3]}, "
                f"offset={self.offset})")

    def __reduce__(self) -> Tuple[Any, ...]:
        return (Segment, (self[0], self[1], self[2], self[3], self.offset, self.meta))


def explain(loader: _LoaderT, step: int, columns: Optional[Sequence[str]] = None) -> List[List[Segment]]:
    """Segments of each row of ``step``'s batch on this rank (see :meth:`Loader.explain`)."""
    order = loader._order
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        G, n = loader.global_batch, order.num_positions
        if (step + 1) * G > n:
            if n == _LAST_POSITION:  # an endless stream: as far as a 64-bit position reaches
                raise IndexError(f"step {step} is past the last step a 64-bit position reaches ({n // G} steps of "
                                 f"{G} samples): positions are below 2**64")
            raise IndexError(f"step {step} is past the end of the stream ({n // G} steps)")
    rows = []
    try:
        for pos in loader._row_positions(step):
            rows.append([Segment(*t) for t in order.segments_at(pos)])
    except RuntimeError as e:  # a step before a recorded weight change that this loader cannot rebuild
        raise StateError(str(e)) from None
    if columns:
        _attach_meta(loader, rows, list(columns))
    return rows


def _attach_meta(loader: _LoaderT, rows: List[List[Segment]], columns: List[str]) -> None:
    """Each segment's ``meta``: its document's values of ``columns``, read from the metadata
    columns of the dataset it came from (document ids are that dataset's, views included)."""
    dss = loader.dataset if isinstance(loader.dataset, list) else [loader.dataset]
    wanted: Dict[int, List[int]] = {}
    for row in rows:
        for seg in row:
            wanted.setdefault(seg.source, []).append(seg.document)
    values: Dict[Tuple[int, int], Dict[str, Any]] = {}
    for src, docs in wanted.items():
        cols = dss[src].columns()
        uniq = sorted(set(docs))
        got = {c: cols.values(c, uniq) for c in columns}
        for k, d in enumerate(uniq):
            values[(src, d)] = {c: got[c][k] for c in columns}
    for row in rows:
        for seg in row:
            seg.meta = dict(values[(seg.source, seg.document)])


def _epoch_range(loader: _LoaderT, epochs: Union[None, int, Tuple[int, int], str]) -> Tuple[int, int]:
    """Epochs [a, b) as given: None (the first), k, (a, b) or "a:b"."""
    if epochs is None:
        return 0, 1
    if isinstance(epochs, str):
        a, sep, b = epochs.partition(":")
        try:
            lo, hi = (int(a), int(b)) if sep else (int(a), int(a) + 1)
        except ValueError:
            raise ValueError(f"epochs: expected 'a:b' (epochs a to b-1) or 'k', got {epochs!r}") from None
    elif isinstance(epochs, int):
        lo, hi = epochs, epochs + 1
    else:
        lo, hi = int(epochs[0]), int(epochs[1])
    if not 0 <= lo < hi:
        raise ValueError(f"epochs: expected 0 <= a < b, got {lo}:{hi}")
    n = loader.num_samples
    if (hi - 1) * n > _LAST_POSITION:
        raise ValueError(f"epochs: epoch {hi - 1} begins past the last 64-bit position (2**64 - 1): at most "
                         f"{_LAST_POSITION // n + 1} epochs of {n} samples")
    return lo, hi


def where(loader: _LoaderT, document: int, source: int = 0,
          epochs: Union[None, int, Tuple[int, int], str] = None) -> List[Dict[str, int]]:
    """Where a document is read in an epoch range (see :meth:`Loader.where`)."""
    if not isinstance(document, int) or isinstance(document, bool) or not 0 <= document <= _LAST_POSITION:
        raise ValueError(f"document: expected an int >= 0 and below 2**64, got {document!r}")
    if not isinstance(source, int) or isinstance(source, bool) or source < 0:
        raise ValueError(f"source: expected an int >= 0, got {source!r}")
    lo, hi = _epoch_range(loader, epochs)
    n = loader.num_samples
    order = loader._order
    try:
        positions = order.find_document(source, document, lo * n, min(hi * n, _LAST_POSITION))
    except RuntimeError as e:  # a step before a recorded weight change that this loader cannot rebuild
        raise StateError(str(e)) from None
    # steps left out (Loader.skip_steps) deliver nothing: a document there is not read
    skips = order.skips()
    starts = [a for a, _ in skips]
    out = []
    for pos in positions:
        i = bisect.bisect_right(starts, pos) - 1
        if i >= 0 and pos < skips[i][1]:
            continue
        try:
            step, rank, row = loader._position_rank_row(pos)
        except RuntimeError as e:  # (balance= rebuilds the step's rows from the order)
            raise StateError(str(e)) from None
        out.append({"step": step, "rank": rank, "row": row, "position": pos,
                    "epoch": pos // n})
    return out


# ------------------------------------------------------------------ the meter
def meter(loader: _LoaderT, window: Optional[int] = None, prefix: str = "") -> Dict[str, Union[int, float]]:
    """The data-wait meter as a flat dict (see :meth:`Loader.meter`)."""
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 0):
        raise ValueError(f"window: expected None or an int >= 0 (batches), got {window!r}")
    gpu: Optional[Dict[str, Any]] = None
    if loader.device_index is not None:
        dev = loader._get_device()
        m: Dict[str, Any] = dev._core.meter(window)
        m["prefetch"] = dev.stats()["prefetch"]
        m["num_threads"] = loader._get_engine().stats()["num_threads"]
        gpu = dev._core.gpu_meter(window)
    else:
        eng = loader._get_engine()
        m = eng.meter(window)
        st = eng.stats()
        m["prefetch"] = st["ring_slots"]
        m["num_threads"] = st["num_threads"]
    m["wait_percent"] = 100.0 * m["wait_fraction"]
    if gpu is not None:
        stopped = str(gpu.pop("stopped", ""))
        if stopped and not getattr(loader, "_gpu_meter_warned", False):
            import warnings

            loader._gpu_meter_warned = True
            warnings.warn(f"the GPU-clock data-wait meter stopped: {stopped}; the gpu_* figures cover the "
                          f"batches before that, the host figures go on", RuntimeWarning, stacklevel=3)
        for k, v in gpu.items():
            m["gpu_" + k] = v
        m["gpu_wait_percent"] = 100.0 * m["gpu_wait_fraction"]
    return {prefix + k: v for k, v in m.items()}


def _gpu_measured(m: Dict[str, Any]) -> bool:
    """Whether a meter dict holds cycles read on the GPU's clock (a device loader given a stream)."""
    return bool(m.get("gpu_batches"))


def _advice(m: Dict[str, Any]) -> str:
    """What to change when a rank waits: from how its waits look."""
    threads, prefetch = int(m.get("num_threads", 0)), int(m.get("prefetch", 0))
    if m.get("ready_ahead_mean", 0.0) < 0.5:
        return (f"the engine does not keep up (no batch ready ahead): raise num_threads (now {threads}), "
                f"or read faster storage / less compressed data (stats()['bytes_read'], docs/performance.md)")
    return (f"batches are usually ready but some arrive late (p99 {1e3 * m.get('wait_p99_seconds', 0.0):.1f} ms): "
            f"raise prefetch (now {prefetch}) to ride out slow reads, or num_threads (now {threads})")


def meter_verdict(m: Dict[str, Any], rank: Optional[int] = None) -> str:
    """One line from a :meth:`Loader.meter` dict: whether data is the bottleneck, and what to change."""
    frac = float(m.get("wait_fraction", 0.0))
    startup = float(m.get("startup_seconds", 0.0))
    if not m.get("batches"):
        if m.get("total_batches"):
            return (f"only the first batch received (start-up: {startup:.2f} s): the steady state is "
                    f"measured from the second batch on")
        return "no batch received yet: nothing measured"
    # the window is the steady state: the first batch's wait (the engine starting) is apart
    after = f"; start-up {startup:.2f} s, not counted" if startup else ""
    # With the GPU measured, what it stood still for is the figure of record: the host's wait in
    # next() cannot see a GPU that idles at the hand-off while the host loop runs ahead of it.
    gpu = _gpu_measured(m)
    k, share = ("gpu_", "of its time for data, on the GPU's clock") if gpu else ("", "of wall time for data")
    figure = float(m.get(k + "wait_fraction", 0.0))
    host = f"; host wait in next() {100 * frac:.1f} %" if gpu else ""
    if figure < _OK_FRACTION:
        ahead = "" if gpu else f", {float(m.get('ready_ahead_mean', 0.0)):.1f} batches ready ahead"
        return (f"data is not the bottleneck: {'the GPU waits ' if gpu else ''}{100 * figure:.1f} % "
                f"{share if gpu else 'of wall time waiting'} (p99 wait "
                f"{1e3 * float(m.get(k + 'wait_p99_seconds', 0.0)):.1f} ms{ahead}{host}{after})")
    who = (f"rank {rank}" if rank is not None else "the GPU" if gpu else "the consumer")
    who += "'s GPU" if gpu and rank is not None else ""
    paren = f" (start-up {startup:.2f} s, not counted)" if startup else ""
    return f"{who} waits {100 * figure:.0f} % {share}{paren}{host}: {_advice(m)}"


def meter_all_ranks(loader: _LoaderT, group: Any = None, window: Optional[int] = None) -> Dict[str, Any]:
    """Gather every rank's :meth:`Loader.meter` over a ``torch.distributed`` process group.

    A collective: every rank of ``group`` (default: the whole world) must call it. Returns,
    on every rank, a dict: ``ranks`` (each rank's meter dict, in group rank order),
    ``slowest_rank`` (the global rank that waited the largest fraction of its time: of its GPU's
    time, on the GPU's clock, when every rank's device loader measured it, else of its wall time
    in ``next()``; ``slowest_by`` says which: ``"gpu"`` or ``"host"``), then, when on the GPU,
    ``gpu_wait_fraction_max``/``_mean``/``_min`` and ``gpu_wait_p99_seconds_max``,
    ``wait_fraction_max``/``_mean``/``_min``, ``wait_p99_seconds_max``, ``startup_seconds_max``
    (the slowest first batch: start-up, outside the windows) and ``verdict``, one
    line: ``"data is not the bottleneck: 0.3 % of wall time waiting (...)"`` or
    ``"rank 5 waits 12 % of wall time for data: ..."`` with what to change.
    """
    import torch.distributed as dist

    if group is None and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("meter_all_ranks gathers every rank's meter over torch.distributed, which is not "
                           "initialised in this process: call it on every rank after "
                           "torch.distributed.init_process_group() (torchrun sets up the environment for it), "
                           "or use loader.meter() and tokenfeed.meter_verdict() in a single process")
    mine = meter(loader, window)
    world = dist.get_world_size(group)
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    ranks: Sequence[Dict[str, Any]] = gathered
    return _summarize_ranks(list(ranks), lambda k: dist.get_global_rank(group, k) if group is not None else k)


def _summarize_ranks(ranks: List[Dict[str, Any]], global_rank: Any) -> Dict[str, Any]:
    """meter_all_ranks' summary of the gathered meter dicts (global_rank: group index -> global rank)."""
    world = len(ranks)
    fr = [float(r["wait_fraction"]) for r in ranks]
    on_gpu = all(_gpu_measured(r) for r in ranks)
    gfr = [float(r.get("gpu_wait_fraction", 0.0)) for r in ranks]
    # the slowest rank by what its GPU waited when every rank measured it, else by the host's wait
    key = gfr if on_gpu else fr
    i = max(range(world), key=lambda k: key[k])
    slowest = global_rank(i)
    out = {
        "ranks": ranks,
        "slowest_rank": slowest,
        "slowest_by": "gpu" if on_gpu else "host",
        "wait_fraction_max": max(fr),
        "wait_fraction_mean": sum(fr) / world,
        "wait_fraction_min": min(fr),
        "wait_p99_seconds_max": max(float(r["wait_p99_seconds"]) for r in ranks),
        "startup_seconds_max": max(float(r.get("startup_seconds", 0.0)) for r in ranks),
        "verdict": meter_verdict(ranks[i], rank=slowest),
    }
    if on_gpu:
        out.update({
            "gpu_wait_fraction_max": gfr[i],
            "gpu_wait_fraction_mean": sum(gfr) / world,
            "gpu_wait_fraction_min": min(gfr),
            "gpu_wait_p99_seconds_max": max(float(r["gpu_wait_p99_seconds"]) for r in ranks),
        })
    return out
