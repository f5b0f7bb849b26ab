"""A state is refused exactly when the stream would change (or the global batch, which its
steps count), and every field is checked.

Each setting is changed in turn on loaders of several kinds; the changed loader must
accept the saved state (``strict=True``) if and only if it delivers the same samples.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

import tokenfeed
from tokenfeed.engine._loader import STATE_FORMAT_VERSION

PAD, SEP = 998, 999

BASES: Dict[str, Dict[str, Any]] = {
    "concat_full": dict(seq_len=8, batch_size=4, seed=1, epochs=2),
    "concat_none": dict(seq_len=8, batch_size=4, seed=1, epochs=2, shuffle=False),
    "endless": dict(seq_len=8, batch_size=4, seed=1),
    "best_fit_block": dict(seq_len=8, batch_size=4, seed=1, epochs=2, packing="best_fit", pad_id=PAD,
                           pack_window=16, shuffle="block", block_size=3, window_blocks=2),
    "mixture": dict(seq_len=8, batch_size=4, seed=1, epochs=2, weights=[0.7, 0.3], mix_window=10),
    "schedule": dict(seq_len=8, batch_size=4, seed=1, weights=[(0, [0.9, 0.1]), (3, [0.2, 0.8])], mix_window=10),
}

# one other value per setting (those of the engine never change the stream)
CHANGES: Dict[str, Any] = {
    "seq_len": 12, "packing": "document", "separator_id": SEP, "seed": 2, "shuffle": "block", "block_size": 5,
    "window_blocks": 3, "epochs": 3, "pad_id": 997, "pack_window": 8, "mix_window": 7, "weights": [0.6, 0.4],
    "batch_size": 8, "num_threads": 2, "prefetch_batches": 3, "backend": "pread", "zstd_cache_bytes": 1 << 20,
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> List[tokenfeed.Dataset]:
    rng = np.random.default_rng(1)
    out = []
    for name, n in (("a", 70), ("b", 40)):
        root = tmp_path_factory.mktemp(name)
        with tokenfeed.DatasetWriter(root / "d", vocab_size=1000) as w:
            for _ in range(n):
                w.add_document(rng.integers(0, 990, size=int(rng.integers(1, 30))))
        out.append(tokenfeed.open(root / "d"))
    return out


def loader(data: List[tokenfeed.Dataset], kw: Dict[str, Any]) -> tokenfeed.Loader:
    kw = {**kw, "output": "numpy", "num_threads": kw.get("num_threads", 1)}
    if kw.get("weights") is None:
        kw.pop("weights", None)
        kw.pop("mix_window", None) if "mix_window" not in kw else None
        return tokenfeed.Loader(data[0], **kw)
    return tokenfeed.Loader(data, **kw)


def samples(ld: tokenfeed.Loader, start: int, limit: int = 200) -> List[bytes]:
    """The samples from global position ``start`` on (all of a finite stream, else ``limit``)."""
    ld.load_state_dict(ld.state_dict() | {"position": start}, strict=False)
    rows: List[bytes] = []
    for batch in ld:
        rows.extend(r.tobytes() for r in np.asarray(batch["tokens"]))
        if len(rows) >= limit and ld.num_positions is None:
            break
    return rows if ld.num_positions is not None else rows[:limit]


# weights only on mixtures (on one dataset they make another loader, of other data:
# test_state_of_another_kind_of_loader_refused covers that)
CASES = [(b, s) for s in sorted(CHANGES) for b in sorted(BASES) if s != "weights" or "weights" in BASES[b]]


@pytest.mark.parametrize("base,setting", CASES)
def test_state_refused_exactly_when_the_stream_changes(data, base, setting):
    kw = BASES[base]
    changed = {**kw, setting: CHANGES[setting]}
    if setting == "epochs" and "epochs" not in kw:
        changed["epochs"] = 3
    a, b = loader(data, kw), loader(data, changed)
    pos = 8  # a multiple of both global batches (4 and 8)
    next(a), next(a)
    state = a.state_dict()
    assert state["position"] == pos
    try:
        b.load_state_dict(state)
        accepted, why = True, ""
    except tokenfeed.StateError as e:
        accepted, why = False, str(e)
    same = samples(loader(data, kw), pos) == samples(loader(data, changed), pos)
    # another global batch (batch_size here) is refused even where the samples are the same:
    # the position and the steps the state's user counts are whole global batches of its size
    assert accepted == (same and setting != "batch_size"), (base, setting, same, why)
    if not accepted:
        assert setting in why or (setting == "batch_size" and "global_batch" in why), why


@pytest.mark.parametrize("base", sorted(b for b in BASES if "weights" not in BASES[b]))
def test_state_of_another_kind_of_loader_refused(data, base):
    """Weights on a single-source base read a mixture of other data: refused both ways."""
    kw = BASES[base]
    mixed = {**kw, "weights": CHANGES["weights"]}
    for saved, resumed in ((kw, mixed), (mixed, kw)):
        a = loader(data, saved)
        next(a), next(a)
        with pytest.raises(tokenfeed.StateError, match="the dataset changed"):
            loader(data, resumed).load_state_dict(a.state_dict())


def test_block_size_under_a_full_shuffle_resumes(data):
    st = loader(data, dict(seq_len=8, batch_size=4, block_size=1024)).state_dict()
    loader(data, dict(seq_len=8, batch_size=4, block_size=2048)).load_state_dict(st)  # same stream: accepted


def bad(state: Dict[str, Any], path: str, value: Any) -> Dict[str, Any]:
    st = json.loads(json.dumps(state))
    *outer, last = path.split(".")
    d = st
    for k in outer:
        d = d[k]
    if value is KeyError:
        del d[last]
    else:
        d[last] = value
    return st


@pytest.mark.parametrize("path,value,message", [
    ("position", "40", r"position: expected a non-negative integer, found a string \(\"40\"\)"),
    ("position", -8, r"position: expected a non-negative integer, found -8"),
    ("position", 8.0, r"position: expected a non-negative integer, found 8"),
    ("position", None, r"position: expected a non-negative integer, found null"),
    ("position", 6, r"position 6 is not a multiple of the global batch 4"),
    ("format_version", "1", r"format_version: expected a non-negative integer, found a string"),
    ("format_version", 9, r"state format version 9 is not supported"),
    ("dataset_fingerprint", 12, r"dataset_fingerprint: expected 16 hex digits, found an integer"),
    ("config.seed", "1", r"config.seed: expected a non-negative integer, found a string"),
    ("config.seed", True, r"config.seed: expected a non-negative integer, found a boolean"),
    ("config.seq_len", 0, r"seq_len: expected 1 <= seq_len"),
    ("config.packing", "best", r"config.packing: 'best' is not a name"),
    ("config.shuffle", 1, r"config.shuffle: expected a name, found an integer"),
    ("config", [], r"config: expected an object, found a list"),
    ("config.weights", "0.5", r"config.weights: expected a list, found a string"),
    ("mix_anchor", [8, [1, 2]], r"mix_anchor: expected one count per source of the saved mixture"),
    ("mix_anchor", {"x": 1}, r"mix_anchor position: expected a non-negative integer, found missing"),
    ("position", KeyError, r"not a tokenfeed loader state: missing position"),
    ("config.seed", 7, r"config_fingerprint .* does not match its config"),
])
def test_state_fields_checked_with_their_types(data, path, value, message):
    ld = loader(data, dict(seq_len=8, batch_size=4, seed=1))
    next(ld), next(ld)
    with pytest.raises(tokenfeed.StateError, match=message):
        ld.load_state_dict(bad(ld.state_dict(), path, value))
    assert ld.position == 8  # a refused state changes nothing


def test_values_from_numpy_and_torch_are_numbers(data):
    import torch

    ld = loader(data, dict(seq_len=8, batch_size=4, seed=1))
    st = ld.state_dict()
    fresh = loader(data, dict(seq_len=8, batch_size=4, seed=1))
    fresh.load_state_dict(st | {"position": np.int64(8), "world_size": torch.tensor(1)})
    assert fresh.position == 8
    with pytest.raises(tokenfeed.StateError, match="not a number, string, list or None"):
        fresh.load_state_dict(st | {"position": object()})


def test_c_state_text_is_what_python_returns(data):
    ld = loader(data, dict(seq_len=8, batch_size=4, seed=1, epochs=2))
    st = ld.state_dict()
    assert st["format_version"] == STATE_FORMAT_VERSION == 2
    # the C state's keys (excluded: documents taken down mid-run, kept by the C order too)
    assert sorted(st) == ["config", "config_fingerprint", "dataset_fingerprint", "excluded", "format_version",
                          "mix_anchor", "order", "position", "samples_per_epoch", "skipped", "weights_history",
                          "weights_initial", "world_size"]
    assert st["excluded"] is None
    assert st["order"] is None  # tokenfeed's own order
    assert st["config"]["block_size"] is None and st["config"]["weights"] is None  # not used: None, but present


@pytest.mark.parametrize("path", ["position", "config.weights"])
def test_nan_in_a_state_is_named(data, path):
    kw = dict(seq_len=8, batch_size=4, seed=1, weights=[0.7, 0.3], mix_window=10)
    ld = loader(data, kw)
    next(ld)
    st = ld.state_dict()
    if path == "position":
        st["position"] = float("nan")
    else:
        st["config"]["weights"] = [0.7, float("nan")]
    with pytest.raises(tokenfeed.StateError, match=path.replace(".", r"\.") + ".* NaN"):
        ld.load_state_dict(st)
    # the C library says so too (it used to lose the parser's sentence)
    text = json.dumps(st)
    with pytest.raises(RuntimeError, match="not valid JSON: NaN"):
        ld._order.state_load(text)
    assert ld.position == 4


def test_a_weights_history_of_zeros_is_refused(data):
    import pickle

    kw = dict(seq_len=8, batch_size=4, seed=1, weights=[0.7, 0.3], mix_window=10)
    ld = loader(data, kw)
    next(ld)
    ld.set_weights([0.5, 0.5])
    st = ld.state_dict()
    assert st["weights_history"] == [[4, [0.5, 0.5]]]
    for bad_entry, says in (([4, [0.0, 0.0]], "every weight is 0"), ([4, [0.5, -1.0]], "weights are finite and >= 0")):
        fresh = loader(data, kw)
        with pytest.raises(tokenfeed.StateError, match=says):
            fresh.load_state_dict(st | {"weights_history": [bad_entry]})
        # refused, so the loader is as it was, and pickles and unpickles as it was
        again = pickle.loads(pickle.dumps(fresh))
        assert again.weights == [0.7, 0.3] and again.state_dict()["weights_history"] is None


def test_a_key_twice_is_refused_in_c_and_in_python(data, tmp_path):
    from tokenfeed.cli._explain import _Problem, _read_state
    from tokenfeed.engine._loader import _state_from_json

    ld = loader(data, dict(seq_len=8, batch_size=4, seed=1, epochs=2))
    next(ld)
    text = json.dumps(ld.state_dict())
    dup = text.replace('"position": 4', '"position": 0, "position": 4')
    assert dup != text
    # C used to take the first value, Python's json the last: both refuse it now
    with pytest.raises(RuntimeError, match="\"position\" appears twice"):
        ld._order.state_load(dup)
    with pytest.raises(tokenfeed.StateError, match="'position' appears twice"):
        _state_from_json(dup)
    path = tmp_path / "state.json"
    path.write_text(dup)
    with pytest.raises(_Problem, match="appears twice"):  # tokenfeed explain --state reads it so
        _read_state(str(path))


def test_a_large_state_loads_and_one_past_the_limits_is_refused(data):
    """Reading a state is linear in its size, and what it may hold is bounded by limits
    that the refusal names (tokenfeed.h: TF_STATE_MAX_*; docs/design.md)."""
    kw = dict(seq_len=8, batch_size=4, seed=1)
    ld = loader(data, kw)
    st = ld.state_dict()
    # 100,000 skipped ranges (1.6 MB of JSON): loads, every range kept
    many = st | {"skipped": [[8 * i, 8 * i + 4] for i in range(100_000)]}
    fresh = loader(data, kw)
    fresh.load_state_dict(many)
    skips = fresh._order.skips()
    assert len(skips) == 100_000 and skips[-1] == (799_992, 799_996)
    assert fresh.state_dict()["skipped"] == many["skipped"]
    # unknown keys are read past, up to the limit on one object's members
    fresh.load_state_dict(st | {f"x{i}": i for i in range(1000)})
    assert fresh._order.skips() == []
    with pytest.raises(tokenfeed.StateError, match="TF_STATE_MAX_MEMBERS"):
        fresh.load_state_dict(st | {f"x{i}": i for i in range(2000)})
    # past the limits: refused, naming the limit
    limit = 1 << 20
    with pytest.raises(tokenfeed.StateError, match="TF_STATE_MAX_SKIPS"):
        fresh.load_state_dict(st | {"skipped": [[8 * i, 8 * i + 4] for i in range(limit + 1)]})
    with pytest.raises(RuntimeError, match="TF_STATE_MAX_BYTES"):
        fresh._order.state_load(json.dumps(st) + " " * (64 << 20))
    mix = loader(data, dict(kw, weights=[0.7, 0.3], mix_window=10))
    mst = mix.state_dict()
    with pytest.raises(tokenfeed.StateError, match="TF_STATE_MAX_WEIGHTS_HISTORY"):
        mix.load_state_dict(mst | {"weights_history": [[0, [0.5, 0.5]]] * 65537})
    assert fresh.position == 0 and fresh._order.skips() == []  # a refused state changes nothing
