"""Provenance: Loader.explain(step) names, for every row of a step's batch, the document
pieces it was cut from; read back from the datasets, they are the batch's tokens, for every
packing, shuffle, mixture, schedule, data- and context-parallel layout, also after a resume.
Loader.where(document) finds the steps that hold a document."""
from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

import tokenfeed
from conftest import numpy_loader

import cp_reference as ref

SEP, PAD = 7, 3


def rebuild(loader, step, fill):
    """This rank's rows of `step`, rebuilt from explain(step) and the datasets' documents."""
    datasets = loader.dataset if isinstance(loader.dataset, list) else [loader.dataset]
    rows = []
    for segs in loader.explain(step):
        row = np.full(loader.seq_len + 1, fill, dtype=np.int64)
        for s in segs:
            assert 0 <= s.start < s.stop <= datasets[s.source].document(s.document).size
            row[s.offset:s.offset + s.stop - s.start] = datasets[s.source].document(s.document)[s.start:s.stop]
        rows.append(row)
    return np.stack(rows)


def check_steps(loader, steps, fill=0):
    for _ in range(steps):
        step = loader.position // loader.global_batch
        got = next(loader)["tokens"]
        assert np.array_equal(rebuild(loader, step, fill), got), f"step {step}"


@pytest.fixture
def two(make_dataset):
    return make_dataset(n_docs=150, vocab=500, seed=1, mean_len=40), make_dataset(n_docs=80, vocab=500, seed=2,
                                                                                  mean_len=90)


@pytest.mark.parametrize("packing", ["concat", "best_fit", "document"])
@pytest.mark.parametrize("shuffle", ["full", "block", "none"])
def test_segments_are_the_batch(two, packing, shuffle):
    sep = SEP if packing == "concat" else None
    l = numpy_loader(two[0], seq_len=32, batch_size=4, seed=5, packing=packing, shuffle=shuffle, block_size=4,
                     window_blocks=3, separator_id=sep, pad_id=None if packing == "concat" else PAD, pack_window=16)
    check_steps(l, 12, fill=SEP if packing == "concat" else PAD)


def test_packed_rows_with_separators(two):
    l = numpy_loader(two[0], seq_len=32, batch_size=4, seed=5, packing="best_fit", separator_id=SEP, pad_id=PAD)
    for _ in range(6):
        step = l.position // l.global_batch
        got = next(l)["tokens"]
        want = rebuild(l, step, -1)
        assert np.array_equal(np.where(want < 0, got, want), got) and np.isin(got[want < 0], [SEP, PAD]).all()


def test_concat_without_separator_is_covered_exactly(two):
    l = numpy_loader(two[0], seq_len=24, batch_size=3, seed=2)
    for step in range(5):
        for segs in l.explain(step):
            assert sum(s.stop - s.start for s in segs) == 25
            assert [s.offset for s in segs] == list(np.cumsum([0] + [s.stop - s.start for s in segs[:-1]]))
    check_steps(l, 5)


@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_mixture_and_schedule(two, packing):
    pad = None if packing == "concat" else PAD
    for weights in ([0.6, 0.4], tokenfeed.WeightSchedule([(0, [1.0, 0.0]), (3, [0.2, 0.8]), (6, [0.5, 0.5])],
                                                         interpolation="linear")):
        l = numpy_loader(list(two), seq_len=32, batch_size=4, seed=9, weights=weights, mix_window=10,
                         packing=packing, pad_id=pad, separator_id=SEP if packing == "concat" else None)
        check_steps(l, 10, fill=SEP if packing == "concat" else PAD)
        sources = {s.source for step in range(10) for row in l.explain(step) for s in row}
        assert sources == {0, 1}


def test_four_data_parallel_ranks(two):
    ranks = [numpy_loader(two[0], seq_len=16, batch_size=2, seed=3, dp_rank=r, dp_size=4) for r in range(4)]
    whole = numpy_loader(two[0], seq_len=16, batch_size=8, seed=3)
    for step in range(4):
        rows = [row for l in ranks for row in l.explain(step)]
        assert rows == whole.explain(step)
    for l in ranks:
        check_steps(l, 4)


@pytest.mark.parametrize("cu", [False, True])
def test_context_parallel_rows_are_whole(two, cu):
    """Under CP, explain gives the whole row the group shares; each rank's input_ids are its share of it."""
    cp = 2
    ls = [numpy_loader(two[0], seq_len=32, batch_size=2, seed=4, cp_rank=r, cp_size=cp) for r in range(cp)]
    plain = numpy_loader(two[0], seq_len=32, batch_size=2, seed=4)
    for step in range(4):
        whole = rebuild(plain, step, 0)
        assert all(l.explain(step) == plain.explain(step) for l in ls)
        for r, l in enumerate(ls):
            got = next(l)["input_ids"]
            assert np.array_equal(got, ref.megatron_cp_split(whole[:, :-1], cp, r))


def test_after_resume(two):
    kw = dict(seq_len=32, batch_size=4, seed=11, packing="best_fit", pad_id=PAD, shuffle="block", block_size=8)
    a = numpy_loader(two[0], **kw)
    for _ in range(5):
        next(a)
    state = json.loads(json.dumps(a.state_dict()))
    b = numpy_loader(two[0], **kw)
    b.load_state_dict(state)
    assert b.position // b.global_batch == 5
    check_steps(b, 6, fill=PAD)
    # a mixture resumed with other weights hands over; explain follows the hand-over
    m = numpy_loader(list(two), seq_len=32, batch_size=4, seed=1, weights=[0.5, 0.5])
    for _ in range(4):
        next(m)
    st = json.loads(json.dumps(m.state_dict()))
    m2 = numpy_loader(list(two), seq_len=32, batch_size=4, seed=1, weights=[0.2, 0.8])
    m2.load_state_dict(st, strict=False)
    check_steps(m2, 5, fill=0)


def test_explain_reads_nothing_and_is_the_same_far_away(two):
    l = numpy_loader(two[0], seq_len=32, batch_size=4, seed=5)
    far = 10 ** 9
    rows = l.explain(far)
    assert len(rows) == 4 and all(rows)
    assert l.stats()["batches"] == 0 and l.stats()["bytes_read"] == 0
    st = l.state_dict()
    st["position"] = far * l.global_batch
    l.load_state_dict(st)
    assert np.array_equal(rebuild(l, far, 0), next(l)["tokens"])


def test_explain_bounds(two):
    l = numpy_loader(two[0], seq_len=32, batch_size=4, seed=5, epochs=1)
    with pytest.raises(ValueError):
        l.explain(-1)
    with pytest.raises(IndexError, match="past the end"):
        l.explain(len(l))
    l.explain(len(l) - 1)


def test_segment_is_a_4_tuple():
    s = tokenfeed.Segment(1, 2, 3, 9, offset=5)
    source, document, start, stop = s
    assert (source, document, start, stop) == (1, 2, 3, 9) == s
    assert (s.source, s.document, s.start, s.stop, s.offset, s.num_tokens) == (1, 2, 3, 9, 5, 6)
    assert pickle.loads(pickle.dumps(s)).offset == 5
    assert "offset=5" in repr(s)


@pytest.mark.parametrize("packing, shuffle, sep", [("concat", "full", None), ("concat", "block", SEP),
                                                  ("concat", "none", SEP), ("best_fit", "full", None),
                                                  ("best_fit", "block", SEP), ("document", "full", None)])
def test_where_finds_every_row_holding_the_document(two, packing, shuffle, sep):
    kw = dict(seq_len=16, batch_size=3, seed=8, packing=packing, pad_id=None if packing == "concat" else PAD,
              dp_rank=1, dp_size=2, shuffle=shuffle, separator_id=sep, block_size=5, window_blocks=3)
    l = numpy_loader(two[0], **kw)
    n, G = l.num_samples, l.global_batch
    want = {}
    for step in range(2 * n // G + 1):
        for r in range(2):
            lr = l if r == 1 else numpy_loader(two[0], **dict(kw, dp_rank=0))
            for row, segs in enumerate(lr.explain(step)):
                for s in segs:
                    want.setdefault(s.document, set()).add((step, r, row))
    for doc in (0, 5, 77, 149):
        got = l.where(doc, epochs="0:2")
        pos_end = 2 * n
        expect = {t for t in want.get(doc, ()) if t[0] * G + t[1] * 3 + t[2] < pos_end}
        assert {(h["step"], h["rank"], h["row"]) for h in got} == expect
        assert all(h["epoch"] in (0, 1) and h["position"] // G == h["step"] for h in got)


@pytest.mark.parametrize("weights", [[0.5, 0.5], tokenfeed.WeightSchedule([(0, [1.0, 0.0]), (5, [0.3, 0.7])],
                                                                          interpolation="linear")])
def test_where_in_a_mixture(two, weights):
    l = numpy_loader(list(two), seq_len=16, batch_size=4, seed=2, weights=weights, mix_window=10)
    n = l.num_samples
    want = {(src, doc): set() for src in (0, 1) for doc in (3, 40)}
    for step in range(2 * n // l.global_batch):
        for row, segs in enumerate(l.explain(step)):
            for s in segs:
                if (s.source, s.document) in want:
                    want[s.source, s.document].add(step * l.global_batch + row)
    for (src, doc), positions in want.items():
        got = [h["position"] for h in l.where(doc, source=src, epochs="0:2")]
        assert got == sorted(p for p in positions if p < 2 * n), (src, doc)
    with pytest.raises(IndexError):
        l.where(3, source=2)
    with pytest.raises(IndexError):
        l.where(10 ** 6, source=0)
    with pytest.raises(ValueError):
        l.where(3, epochs="2:1")


@pytest.mark.parametrize("mode, M", [("attention", 1), ("attention", 2), ("tokens", 3)])
def test_balanced_rows_are_the_batch(two, mode, M, capsys):
    """With balance= each rank's rows are those the balancing rule gives it: explain's segments
    rebuild them, and where() names the step, rank and row that receive each position."""
    kw = dict(seq_len=32, batch_size=3, seed=5, packing="best_fit", pad_id=PAD, dp_size=4, balance=mode,
              balance_micro_batches=M)
    ranks = [numpy_loader(two[0], dp_rank=r, **kw) for r in range(4)]
    plain = numpy_loader(two[0], dp_rank=0, **dict(kw, balance=None))
    steps = 4 * M
    assert any(ranks[0]._row_positions(s) != plain._row_positions(s) for s in range(steps))  # rows did move
    for l in ranks:
        check_steps(l, steps, fill=PAD)
    l = ranks[0]
    n, G = l.num_samples, l.global_batch
    got_by_explain = {}
    for step in range(-(-n // (G * M)) * M):
        for r, lr in enumerate(ranks):
            for row, (pos, segs) in enumerate(zip(lr._row_positions(step), lr.explain(step))):
                for s in segs:
                    if pos < n:
                        got_by_explain.setdefault(s.document, set()).add((step, r, row, pos))
    for doc in (0, 5, 77, 149):
        hits = {(h["step"], h["rank"], h["row"], h["position"]) for h in l.where(doc)}
        assert hits == got_by_explain.get(doc, set()), doc
    # the command line, told the balancing the loader used
    from tokenfeed.cli import main

    rc = main(["explain", str(two[0].paths[0]), "--step", "1", "--rank", "2", "--dp-size", "4", "--seq-len", "32",
               "--global-batch", "12", "--seed", "5", "--packing", "best_fit", "--pad-id", str(PAD), "--balance", mode,
               "--balance-micro-batches", str(M), "--json"])
    assert rc == 0
    assert [r["position"] for r in json.loads(capsys.readouterr().out)["rows"]] == ranks[2]._row_positions(1)


# ------------------------------------------------------------------ the CLI
def test_steps_before_weight_changes_are_the_ones_trained_on(two, tmp_path, capsys):
    """Two ranks train through two set_weights changes; the state saved at the end, restored
    into fresh loaders (built with the first weights, with the last ones, or by the CLI from
    the state alone), explains every step, before the changes too, with exactly the rows and
    sources the loop received, and where() finds every document where it was read."""
    from tokenfeed.cli import main

    kw = dict(seq_len=16, batch_size=2, seed=5, mix_window=10, source_ids=True, dp_size=2)
    run = [numpy_loader(list(two), weights=[0.5, 0.5], dp_rank=r, **kw) for r in range(2)]
    log = {}  # (step, rank) -> (tokens, source_ids) the loop received
    for step in range(24):
        for r, ld in enumerate(run):
            if step in (6, 14):
                ld.set_weights([1.0, 0.0] if step == 6 else [0.0, 1.0])
            b = next(ld)
            log[step, r] = (b["tokens"].copy(), b["source_ids"].copy())
    def read(steps):
        return {int(s) for step in steps for r in range(2) for s in log[step, r][1]}

    assert read(range(6)) == {0, 1} and read(range(6, 14)) == {0} and read(range(14, 24)) == {1}
    state = json.loads(json.dumps(run[0].state_dict()))
    assert [p for p, _ in state["weights_history"]] == [6 * 4, 14 * 4]
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))

    for weights in ([0.5, 0.5], [0.1, 0.9], [0.3, 0.7]):
        ranks = [numpy_loader(list(two), weights=weights, dp_rank=r, **kw) for r in range(2)]
        for ld in ranks:
            ld.load_state_dict(state)
        ranks.append(pickle.loads(pickle.dumps(run[1])))  # a pickled loader (DataLoader workers) too
        for step in range(24):
            for r, ld in enumerate(ranks):
                tokens, sources = log[step, ld.dp_rank]
                assert np.array_equal(rebuild(ld, step, 0), tokens), (weights, step, r)
                assert [row[0].source for row in ld.explain(step)] == sources.tolist(), (weights, step, r)
    ld = ranks[0]
    for step in range(24):
        for r in range(2):
            for row, segs in enumerate(ranks[r].explain(step)):
                for sg in segs:
                    hits = ld.where(sg.document, source=sg.source)
                    assert {"step": step, "rank": r, "row": row} in [{k: h[k] for k in ("step", "rank", "row")}
                                                                   for h in hits], (step, r, row, sg)
                    for h in hits:  # and every hit in the steps trained holds the document
                        if h["step"] < 24:
                            got = ranks[h["rank"]].explain(h["step"])[h["row"]]
                            assert (sg.source, sg.document) in [(x.source, x.document) for x in got]
    data = [d.paths[0] for d in two]
    for step in range(24):
        for r in range(2):
            rc = main(["explain", *data, "--step", str(step), "--rank", str(r), "--dp-size", "2", "--state",
                       str(path), "--json"])
            cap = capsys.readouterr()
            assert rc == 0, cap.err
            out = json.loads(cap.out)
            assert [[(sg["source"], sg["document"], sg["start"], sg["stop"], sg["offset"]) for sg in row["segments"]]
                    for row in out["rows"]] == [[(sg.source, sg.document, sg.start, sg.stop, sg.offset) for sg in row]
                                                for row in ranks[r].explain(step)], (step, r)

    # a state that does not record the first weights (written before it did), into a loader built
    # with other weights than the run began with: the steps before the last change are refused
    # by name, never answered with other data; from the last change on it answers
    old = {k: v for k, v in state.items() if k != "weights_initial"}
    ok = numpy_loader(list(two), weights=[0.5, 0.5], dp_rank=0, **kw)
    ok.load_state_dict(old)
    assert np.array_equal(rebuild(ok, 3, 0), log[3, 0][0])
    other = numpy_loader(list(two), weights=[0.3, 0.7], dp_rank=0, **kw)
    other.load_state_dict(old)
    with pytest.raises(tokenfeed.StateError, match=r"step 3 is before the mixture's last weight change \(step 14\)"
                       r".* not the ones its run began with"):
        other.explain(3)
    first = ok.explain(3)[0][0]
    with pytest.raises(tokenfeed.StateError, match="last weight change"):
        other.where(first.document, source=first.source)
    assert np.array_equal(rebuild(other, 20, 0), log[20, 0][0])


def test_cli_explain_and_where(tmp_path, capsys):
    from conftest import bpe_tokenizer
    from tokenfeed.cli import main

    texts = [f"document number {i} says " + " ".join(["alpha", "beta", "gamma"][i % 3] for _ in range(i % 7 + 3))
             for i in range(60)]
    tok = bpe_tokenizer(texts)
    tpath = str(tmp_path / "tokenizer.json")
    tok.save(tpath)
    data = tmp_path / "data"
    with tokenfeed.DatasetWriter(data, vocab_size=tok.get_vocab_size(), shard_tokens=300) as w:
        for t in texts:
            w.add_document(np.array(tok.encode(t).ids))
    ds = tokenfeed.open(data)
    kw = dict(seq_len=16, batch_size=2, seed=3, dp_rank=1, dp_size=2)
    l = numpy_loader(ds, **kw)
    for _ in range(3):
        next(l)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"model": "elsewhere", "loader": l.state_dict()}))

    rc = main(["explain", str(data), "--step", "4", "--rank", "1", "--dp-size", "2", "--state", str(state),
               "--tokenizer", tpath, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(out["rows"]) == 2
    rows = l.explain(4)
    for got, want in zip(out["rows"], rows):
        assert [(s["source"], s["document"], s["start"], s["stop"], s["offset"]) for s in got["segments"]] == \
            [(s.source, s.document, s.start, s.stop, s.offset) for s in want]
        for s in got["segments"]:
            assert s["file"].endswith(".tfs") and os.path.exists(s["file"])
            assert s["text"] == tok.decode(ds.document(s["document"])[s["start"]:s["stop"]].tolist())
    # the text form, configured by options instead of a state
    rc = main(["explain", str(data), "--step", "4", "--rank", "1", "--dp-size", "2", "--seq-len", "16",
               "--global-batch", "4", "--seed", "3", "--tokenizer", tpath])
    text = capsys.readouterr().out
    assert rc == 0 and text.startswith("step 4, rank 1 of 2: 2 rows")
    assert f"document {rows[0][0].document}" in text and '"' in text

    doc = rows[1][0].document
    rc = main(["where", str(data), "--document", str(doc), "--state", str(state), "--dp-size", "2", "--json"])
    hits = json.loads(capsys.readouterr().out)["rows"]
    assert rc == 0 and {"step": 4, "rank": 1, "row": 1} in [{k: h[k] for k in ("step", "rank", "row")} for h in hits]
    rc = main(["where", str(data), "--document", str(doc), "--state", str(state), "--dp-size", "2"])
    assert rc == 0 and "step 4  rank 1  row 1" in capsys.readouterr().out

    # a state from other data is refused, as a resume would refuse it
    other = tmp_path / "other"
    with tokenfeed.DatasetWriter(other, vocab_size=tok.get_vocab_size()) as w:
        w.add_document(np.arange(100) % 50)
    assert main(["explain", str(other), "--step", "0", "--state", str(state), "--dp-size", "2"]) == 1
    assert "dataset changed" in capsys.readouterr().err
    assert main(["explain", str(data), "--step", "0"]) == 1
    assert "--state" in capsys.readouterr().err


@pytest.mark.parametrize("args, says", [
    (["explain", "{data}", "--step", "10000", "--seq-len", "16", "--global-batch", "4", "--epochs-total", "1"],
     "past the end"),
    (["where", "{data}", "--document", "999999", "--seq-len", "16", "--global-batch", "4"], "documents"),
    (["where", "{data}", "--document", "1", "--source", "3", "--seq-len", "16", "--global-batch", "4"], "source 3"),
    (["explain", "{data}", "--step", "0", "--seq-len", "16", "--global-batch", "4", "--dp-size", "3"],
     "does not divide"),
    (["explain", "{data}", "--step", "0", "--state", "{data}/../nothing.json"], "nothing.json"),
])
def test_cli_errors_are_one_line(two, capsys, args, says):
    from tokenfeed.cli import main

    data = os.path.dirname(two[0].files()[0]["path"])
    rc = main([a.format(data=data) for a in args])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and err.startswith("tokenfeed: error: ") and says in err, err


@pytest.mark.parametrize("epochs", [None, 1])
def test_explain_and_where_refuse_values_past_64_bits(two, epochs):
    l = numpy_loader(two[0], seq_len=32, batch_size=4, seed=5, epochs=epochs)
    # a step whose positions pass 2**64: an error naming the limit, never a bare OverflowError
    with pytest.raises(IndexError, match="2\\*\\*64|past the end"):
        l.explain(2**62)
    with pytest.raises(IndexError, match="2\\*\\*64|past the end"):
        l.explain(2**64 + 1)
    # a document number past 64 bits is not document 5 wrapped round
    with pytest.raises(ValueError, match="2\\*\\*64"):
        l.where(2**64 + 5)
    assert l.where(5)  # document 5 itself is found
    # an epoch range reaching past 2**64 positions: refused, naming the limit (not an empty answer)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        l.where(5, epochs=(0, 2**64))
    with pytest.raises(ValueError, match="2\\*\\*64"):
        l.where(5, epochs=f"{2**63}:{2**63 + 1}")
    # the binding itself names the limit
    with pytest.raises(OverflowError, match="2\\*\\*64"):
        l._order.segments_at(2**64 + 3)
    with pytest.raises(OverflowError, match="2\\*\\*64"):
        l._order.find_document(0, 2**64 + 5, 0, 10)
