"""The run: data, then each group of measurements, into one report dict.

Groups (``--only`` / ``--skip``):

* ``tokenfeed``, ``ceiling``, ``baselines``, ``peers``: warm throughput on the same
  data and batch shape, one fresh process per configuration;
* ``stalls``: the consumer with a fixed step time, in rounds (median and range), added to
  the main row of each loader; alone (``--only stalls``) it runs the main rows of
  tokenfeed and the baselines, with that loop, and nothing else;
* ``startup``: time to first batch at 10^3 and 10^4 shards (and 10^12 sparse tokens);
* ``restore``: a fresh loader restored at deep positions from its own resumable state;
* ``larger``: a file bigger than RAM (``--big-size``), shuffled, per backend, beside fio;
* ``zstd``: compression ratio and decode rate of the generated data.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import adapters, ceiling, data, fio, install
from .common import Log, human, human_bytes, machine_info, meminfo_bytes, package_parent, spawn
from .peers import PEERS, Peer

SCHEMA_VERSION = 2
GROUPS = ("tokenfeed", "ceiling", "baselines", "peers", "stalls", "startup", "restore", "larger", "zstd")
STEP_MS = (1.0, 5.0, 20.0, 100.0)

Case = Dict[str, Any]


class Runner:
    """Runs cases in child processes and collects rows, with progress on stderr."""

    def __init__(self, args: Any, log: Callable[[str], None]) -> None:
        self.args, self.log = args, log
        self.results: List[Dict[str, Any]] = []

    def skip(self, name: str, group: str, status: str, reason: str, config: Optional[Dict[str, Any]] = None) -> None:
        self.results.append({"name": name, "group": group, "config": config or {}, "note": "", "status": status,
                             "reason": reason})

    def run(self, name: str, group: str, case: Case, *, note: str = "", python: str = sys.executable,
            pythonpath: Optional[str] = None, headline: bool = False) -> Dict[str, Any]:
        """One measurement in a child process. `headline`: the row is a loader a training team
        would compare (printed without --verbose, and in the verdict when it has stalls);
        rows of the groups in report.HEADLINE_GROUPS are headline rows anyway."""
        self.log(f"{name} ...")
        t = time.monotonic()
        prep: Dict[str, Any] = {}
        if case.get("kind") == "ceiling":
            r = ceiling.run_ceiling(case)
        else:
            if pythonpath is not None:  # a peer: convert its data in a process of its own first
                prep = spawn(dict(case, mode="prepare"), python=python, timeout=self.args.timeout,
                             pythonpath=pythonpath)
            if prep.get("status", "ok") != "ok":
                r = prep
            else:
                r = spawn(case, python=python, timeout=self.args.timeout, pythonpath=pythonpath)
                if prep.get("prepare"):
                    r["prepare"] = prep["prepare"]
        hidden = ("offsets", "samples", "offsets_file", "binary", "peer_dir", "warmup", "seconds", "timeout",
                  "raw", "doc_ends", "path", "step_ms", "stall_seconds", "stall_repeats", "mode")
        row = {"name": name, "group": group, "config": {k: v for k, v in case.items() if k not in hidden},
               "note": note}
        if headline:
            row["headline"] = True
        row.update(r)
        row.setdefault("status", "failed")
        if row["status"] == "ok" and "tokens_per_s" in row:
            self.log(f"    {human(row['tokens_per_s'])} tokens/s, p50 {row['p50_ms']:.3f} ms, p99 {row['p99_ms']:.3f}"
                     f" ms, {row['cpu_s_per_btok']:.1f} CPU s/Gtok, peak RSS {row['peak_rss_mb']:.0f} MB"
                     + (", stalled " + " ".join(f"{s['step_ms']:g}ms:{s['stall_fraction'] * 100:.0f}%"
                                                for s in row.get("stalls", [])) if row.get("stalls") else "")
                     + f" ({time.monotonic() - t:.1f}s)")
        elif row["status"] != "ok":
            self.log(f"    {row['status']}: {row.get('reason')}")
        return row


# ----------------------------------------------------------------------------- peers


def resolve_peers(args: Any, log: Callable[[str], None]) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Any]]:
    """{peer key: {"python", "pythonpath"} or {"status", "reason"}}, and what installing did."""
    root = os.path.join(args.cache_dir, "peer-envs")
    chosen = [p for p in PEERS if p.key in args.peers]
    out: Dict[str, Dict[str, Any]] = {}
    envs: Dict[str, Any] = {}
    shim = install.shim_dir(root)
    for p in chosen:
        if args.install_peers:
            r = install.ensure_peer(p, root, timeout=args.install_timeout, log=log)
            envs[p.key] = {k: v for k, v in r.items() if k != "python"}
            if r["status"] == "ok":
                out[p.key] = {"python": r["python"], "pythonpath": shim, "versions": r.get("versions", {})}
            else:
                out[p.key] = {"status": "not installed", "reason": f"--install-peers: {r['reason']}"}
            continue
        py = install.find_installed(p, root)
        if py:
            out[p.key] = {"python": py, "pythonpath": shim}
            continue
        chk = install.check_import(sys.executable, p, pythonpath=package_parent())
        if chk["ok"]:
            out[p.key] = {"python": sys.executable, "pythonpath": package_parent(), "versions": chk["versions"]}
        else:
            out[p.key] = {"status": "not installed",
                          "reason": f"{p.key} is not installed: run with --install-peers (a private environment "
                                    f"per peer in {root}), or install it here: {install.install_hint(p)}"}
    return out, envs


def peer_note(p: Peer, L: int, B: int, nw: int) -> str:
    notes = {
        "litdata": f"optimize(item_loader=TokensLoader()) chunks of {L + 1}x512 tokens; StreamingDataset("
                   f"TokensLoader(block_size={L + 1}), shuffle=True); StreamingDataLoader(batch_size={B}, "
                   f"num_workers={nw}, pin_memory=True) as in litgpt pretraining; widened to int64",
        "megatron-core": f"IndexedDatasetBuilder .bin/.idx; GPTDataset via BlendedMegatronDatasetBuilder "
                         f"(sequence_length={L}, mmap_bin_files=True, create_attention_mask=False); "
                         f"DataLoader(num_workers={nw}, pin_memory=True)",
        "datasets": f"{L + 1}-token rows saved to disk (Arrow), load_from_disk().with_format('torch'); "
                    f"DataLoader(batch_size={B}, num_workers={nw}) over the shared sample list",
        "grain": f"RandomAccessDataSource over the flat file (numpy int64); IndexSampler(shuffle=True); "
                 f"Batch({B}); DataLoader(worker_count={nw})",
        "torchdata": f"StatefulDataLoader(map-style memmap dataset, batch_size={B}, shuffle=True, "
                     f"num_workers={nw})",
        "mosaicml-streaming": f"MDSWriter({{'tokens': 'bytes'}}, no compression, 64 MB shards) of {L + 1}-token "
                              f"samples; StreamingDataset(shuffle=True, batch_size={B}) (py1e); "
                              f"DataLoader(num_workers={nw}, pin_memory=True)",
    }
    return notes.get(p.key, "")


# ----------------------------------------------------------------------------- the run


def run(args: Any) -> Dict[str, Any]:
    import tokenfeed

    log = Log(args.quiet)
    os.makedirs(args.cache_dir, exist_ok=True)
    t_start = time.monotonic()
    report: Dict[str, Any] = {"schema": SCHEMA_VERSION, "tool": "tokenfeed bench", "argv": getattr(args, "argv", None),
                              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_info(),
                              "quick": bool(args.quick), "groups": sorted(args.groups)}
    m = report["machine"]
    log(f"machine: {m['cpu_model']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}")
    log(estimate(args))
    bi = tokenfeed.build_info()
    have_torch = _has_torch()
    L, B = args.seq_len, args.batch_size
    nw = max(1, min(2, os.cpu_count() or 1))

    # ---- peers first: installing is the slow, fallible part, and it says so up front
    peers: Dict[str, Dict[str, Any]] = {}
    if "peers" in args.groups or "restore" in args.groups or "startup" in args.groups:
        peers, envs = resolve_peers(args, log)
        if envs:
            report["peer_envs"] = envs

    # ---- data
    if args.data:
        paths = args.data if len(args.data) > 1 else args.data[0]
        ds = tokenfeed.open(paths, dtype=args.dtype)
        run_dir = os.path.join(args.cache_dir, f"data-{ds.fingerprint}")
        os.makedirs(run_dir, exist_ok=True)
        raw = data.raw_copy(ds, os.path.join(run_dir, "train.bin"), log)
        report["dataset"] = {"generated": False, "path": args.data, "format": ds.format, "tokens": ds.num_tokens,
                             "documents": ds.num_documents, "dtype": ds.dtype.name, "vocab_size": ds.vocab_size,
                             "files": ds.num_files}
        native: Any = paths
        zdir: Optional[str] = None
        vocab = ds.vocab_size or int(np.iinfo(ds.dtype).max) + 1
        doc_ends = None
    else:
        key = hashlib.sha1(json.dumps([args.tokens, args.vocab_size, args.doc_length, args.zipf, args.seed]).encode())
        run_dir = os.path.join(args.cache_dir, f"gen-{human(args.tokens)}-{key.hexdigest()[:10]}")
        meta = data.generate_dataset(run_dir, tokens=args.tokens, vocab_size=args.vocab_size,
                                     doc_length=args.doc_length, zipf=args.zipf, seed=args.seed, log=log)
        native, zdir, raw = meta["native"], meta["zstd"], meta["raw"]
        doc_ends = meta.get("doc_ends")
        ds = tokenfeed.open(native)
        vocab = args.vocab_size
        report["dataset"] = {"generated": True, "path": run_dir, "format": ds.format, "tokens": ds.num_tokens,
                             "documents": ds.num_documents, "dtype": ds.dtype.name, "vocab_size": vocab,
                             "doc_length": args.doc_length, "doc_length_stats": meta["doc_length_stats"],
                             "zipf": args.zipf, "generation_s": meta["seconds"], "reused": meta["reused"]}
    raw_dtype = ds.dtype.name
    report["config"] = {"seq_len": L, "batch_size": B, "seed": args.seed, "data_dtype": raw_dtype,
                        "output_dtype": "int64", "shuffle": "full", "tokens_per_batch": B * L,
                        "seconds_per_case": args.seconds, "warmup_batches": args.warmup, "workers": nw,
                        "step_ms": list(args.step_ms), "stall_seconds": args.stall_seconds,
                        "stall_repeats": args.stall_repeats,
                        "token_count_note": "tokens/s counts batch x seq_len training tokens per batch"}

    # ---- the shared sample list: tokenfeed's own full-shuffle order
    samples = data.sample_list(ds, L, B, args.seed, min(ds.num_tokens // L, 1 << 21))
    samples_path = os.path.join(run_dir, f"samples-{L}-{B}-{args.seed}.npy")
    np.save(samples_path, samples)
    offsets_file = os.path.join(run_dir, f"offsets-{L}-{B}-{args.seed}.u64")
    (samples * np.uint64(L)).astype(np.uint64).tofile(offsets_file)
    peer_dir = os.path.join(run_dir, "peers")
    os.makedirs(peer_dir, exist_ok=True)
    base: Case = {"seq_len": L, "batch_size": B, "seed": args.seed, "warmup": args.warmup, "seconds": args.seconds,
                  "samples": samples_path, "raw": raw, "raw_dtype": raw_dtype, "vocab_size": vocab,
                  "peer_dir": peer_dir, "doc_ends": doc_ends, "workers": nw}
    stall: Case = ({"step_ms": list(args.step_ms), "stall_seconds": args.stall_seconds,
                    "stall_repeats": args.stall_repeats} if "stalls" in args.groups else {})
    # --only stalls: the main rows only, each with the step-time loop
    main_only = bool(getattr(args, "stalls_only", False))
    if main_only:
        log("--only stalls: the step-time loop on tokenfeed's and the baselines' main loaders "
            "(add peers to --only for the peer loaders, tokenfeed for tokenfeed's variants)")
    out_kind = "torch" if have_torch else "numpy"
    tf = dict(base, kind="tokenfeed_loader", path=native, output=out_kind, dtype_in=args.dtype if args.data else None)
    R = Runner(args, log)

    if "tokenfeed" in args.groups:
        R.results.append(R.run("tokenfeed", "tokenfeed", dict(tf, **stall), headline=True,
                               note=f"reference: shuffle=full, default threads and backend, int64, output={out_kind}"))
        for name, extra in () if main_only else (
                ("threads=1", {"threads": 1}), ("threads=2", {"threads": 2}),
                ("shuffle=block", {"shuffle": "block"}), ("shuffle=none", {"shuffle": False}),
                ("backend=mmap", {"backend": "mmap"}), ("backend=pread", {"backend": "pread"})):
            R.results.append(R.run(f"tokenfeed {name}", "tokenfeed", dict(tf, **extra)))
        if main_only:
            pass
        elif bi.get("io_uring", {}).get("usable"):
            R.results.append(R.run("tokenfeed backend=io_uring", "tokenfeed", dict(tf, backend="io_uring")))
        else:
            R.skip("tokenfeed backend=io_uring", "tokenfeed", "skipped",
                   f"io_uring not usable here: {bi.get('io_uring', {}).get('detail')}")
        if zdir and bi.get("zstd", {}).get("usable"):
            R.results.append(R.run("tokenfeed zstd data", "tokenfeed", dict(tf, path=zdir, **stall), headline=True,
                                   note="full shuffle: every sample decompresses its own zstd block"))
            if not main_only:
                R.results.append(R.run("tokenfeed zstd data shuffle=block", "tokenfeed",
                                       dict(tf, path=zdir, shuffle="block"),
                                       note="two-level shuffle: consecutive samples share a decompressed block"))
        else:
            R.skip("tokenfeed zstd data", "tokenfeed", "skipped",
                   "--data given: no zstd copy of it is made" if not zdir else "zstd not compiled in")
        if not main_only:
            R.results.append(R.run("tokenfeed dtype=int32", "tokenfeed", dict(tf, out_dtype="int32")))
            if have_torch:
                R.results.append(R.run("tokenfeed output=numpy", "tokenfeed", dict(tf, output="numpy")))
            R.results.append(R.run("tokenfeed on the flat .bin", "tokenfeed", dict(tf, path=raw, dtype_in=raw_dtype),
                                   note="the same headerless file the other loaders read"))
            if have_torch:  # the DataLoader adapters (tokenfeed.torch)
                R.results.extend(adapters.rows(R, tf, nw))
        if bi.get("cuda", {}).get("usable"):
            R.results.append(R.run("tokenfeed device=cuda", "tokenfeed", dict(tf, device="cuda", **stall),
                                   headline=True))
        else:
            R.skip("tokenfeed device=cuda", "tokenfeed", "skipped",
                   f"no usable CUDA device: {bi.get('cuda', {}).get('detail')}")

    if "ceiling" in args.groups:
        binary, why = ceiling.compile_ceiling(args.cache_dir)
        for t in (1, 2):
            name = f"C gather ceiling ({t} thread{'s' if t > 1 else ''})"
            if binary is None:
                R.skip(name, "ceiling", "skipped", why or "?")
                continue
            R.results.append(R.run(name, "ceiling", dict(base, kind="ceiling", binary=binary, path=raw,
                                                         offsets_file=offsets_file,
                                                         elem_size=np.dtype(raw_dtype).itemsize, threads=t),
                                   note="same shuffled samples, mmap -> int64, ceiling.c at cc -O3 -march=native"))

    cuda = bool(bi.get("cuda", {}).get("usable"))
    if "baselines" in args.groups:
        if have_torch:
            R.results.append(R.run("nanoGPT get_batch", "baseline", dict(base, kind="nanogpt", **stall),
                                   note="karpathy/nanoGPT get_batch: np.memmap per batch, torch.stack of "
                                        "astype(int64) slices for x and y; offsets from the shared sample list"))
            for w in (nw,) if main_only else (0, 2, 4):
                for pin in (False,) if main_only else (False, True) if cuda else (False,):
                    name = f"DataLoader workers={w}{' pin_memory' if pin else ''}"
                    extra = stall if (w == nw and not pin) else {}
                    R.results.append(R.run(name, "baseline", dict(base, kind="torch_dataloader", workers=w,
                                                                  pin_memory=pin, **extra),
                                           note="map-style Dataset over np.memmap, default collate, shared "
                                                "sample list"))
        else:
            R.skip("nanoGPT get_batch", "baseline", "not installed", "torch is not installed (pip install torch)")
            R.skip("DataLoader", "baseline", "not installed", "torch is not installed (pip install torch)")

    if "peers" in args.groups:
        for p in PEERS:
            if p.key not in args.peers:
                continue
            where = peers.get(p.key, {})
            if "python" not in where:
                R.skip(p.name, "peer", where.get("status", "not installed"), where.get("reason", "?"))
                continue
            row = R.run(p.name, "peer", dict(base, kind=p.loader, **stall), note=peer_note(p, L, B, nw),
                        python=where["python"], pythonpath=where["pythonpath"])
            row["peer"] = p.key
            R.results.append(row)
    elif args.no_peers:
        for p in PEERS:
            R.skip(p.name, "peer", "skipped", "--no-peers")

    results = R.results
    report["results"] = results
    _ratios(report)

    if "startup" in args.groups:
        report["startup"] = _startup(R, base, tf, peers, raw, raw_dtype, args, log)
    if "restore" in args.groups:
        report["restore"] = _restore(R, base, tf, peers, have_torch, args, log)
    if "larger" in args.groups:
        report["larger_than_memory"] = _larger(R, base, args, bi, have_torch, log)
    if "zstd" in args.groups:
        report["zstd"] = _zstd_figures(native, zdir, log)
    report["left_on_disk"] = {"path": os.path.abspath(args.cache_dir), "bytes": install.dir_size(args.cache_dir)}
    report["total_seconds"] = round(time.monotonic() - t_start, 1)
    log(f"done in {report['total_seconds']}s")
    return report


def estimate(args: Any) -> str:
    """How long the run will take, said before it starts: a rough sum over the groups
    (a child process costs ~3 s to start and import; installs and first-time data
    generation come on top)."""
    per_case = args.seconds + 3.0
    g = args.groups
    secs = 0.0
    stall_rows = 0
    main_only = bool(getattr(args, "stalls_only", False))  # --only stalls: the main rows alone
    if "tokenfeed" in g:
        secs += (2 if main_only else 12) * per_case
        stall_rows += 2
    if "ceiling" in g:
        secs += 2 * per_case + 5
    if "baselines" in g:
        secs += (2 if main_only else 4) * per_case
        stall_rows += 2
    if g & {"peers", "startup", "restore"}:
        secs += 5 * len(args.peers)  # each peer's import is tried in a child process first
    npeers = len(args.peers) if "peers" in g else 0
    secs += npeers * per_case
    stall_rows += npeers
    if "stalls" in g:
        per_round = sum(max(args.stall_seconds, 10 * t / 1e3) for t in args.step_ms)  # 10 steps at least
        secs += stall_rows * per_round * getattr(args, "stall_repeats", 1)
    if "startup" in g:
        secs += len(args.shards) * 8 + (10 if args.sparse_tokens else 0)
    if "restore" in g:
        secs += 4 * 4.0
    size = 0
    if "larger" in g:
        size = args.big_size or int((meminfo_bytes() or 0) * 1.6)
        secs += size / 400e6 + 5 * (args.big_seconds + 3) + 2 * args.fio_seconds
    gen = args.tokens / 10e6 if not args.data else 0.0
    disk = (args.tokens * 2 * 3.5 if not args.data else 0) + size  # the larger-than-memory file only if it runs
    mins = (secs + gen) / 60
    return (f"this run takes about {max(1, round(mins))} minute{'s' if mins >= 1.5 else ''} on this machine when "
            f"it is idle "
            f"({round(gen / 60, 1)} of them generating data, which a later run reuses; peer installs with "
            f"--install-peers come on top) and writes up to {human_bytes(disk)} under {args.cache_dir}"
            + (" (the larger-than-memory file is removed at the end)" if "larger" in g and not args.keep_big else ""))


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _ratios(report: Dict[str, Any]) -> None:
    results = report["results"]

    def tps(name: str) -> Optional[float]:
        for r in results:
            if r["name"] == name and r.get("status") == "ok":
                return float(r["tokens_per_s"])
        return None

    ref = tps("tokenfeed")
    c1, c2 = tps("C gather ceiling (1 thread)"), tps("C gather ceiling (2 threads)")
    ceil = max([c for c in (c1, c2) if c] or [0]) or None
    for r in results:
        if r.get("status") == "ok" and "tokens_per_s" in r:
            r["ratio_to_tokenfeed"] = r["tokens_per_s"] / ref if ref else None
            r["ratio_to_ceiling"] = r["tokens_per_s"] / ceil if ceil else None
    cpu1 = next((r["cpu_s_per_btok"] for r in results
                 if r["name"] == "C gather ceiling (1 thread)" and r.get("status") == "ok"), None)
    report["reference"] = {"tokenfeed_tokens_per_s": ref, "ceiling_tokens_per_s": ceil,
                           "ceiling_1_thread_tokens_per_s": c1, "ceiling_2_threads_tokens_per_s": c2,
                           "ceiling_cpu_s_per_btok": cpu1}


# ----------------------------------------------------------------------------- start-up


def _startup(R: Runner, base: Case, tf: Case, peers: Dict[str, Dict[str, Any]], raw: str, raw_dtype: str,
             args: Any, log: Callable[[str], None]) -> List[Dict[str, Any]]:
    """Time to first batch (fresh process, open + first batch) at each shard count."""
    out: List[Dict[str, Any]] = []
    ntok = os.path.getsize(raw) // np.dtype(raw_dtype).itemsize
    catalogs = tempfile.mkdtemp(prefix="tokenfeed-bench-catalog-")  # private, as the node's catalog must be
    for n in args.shards:
        # tokenfeed opens the shard set by glob twice, as a node's first process and as any later
        # one: the first open reads every header and writes the node's catalog, later ones read
        # the catalog (docs/format.md, "The node's catalog")
        rows = [{"loader": "tokenfeed", "shards": n, "tokens": ntok},
                {"loader": "tokenfeed (node catalog)", "shards": n, "tokens": ntok}]
        try:
            d = os.path.join(os.path.dirname(raw), f"llmc-{n}-shards")
            data.make_llmc_shards(raw, raw_dtype, d, n)
            # the catalog records files left unmodified for 2 s: a set written just now settles first
            time.sleep(max(0.0, os.stat(d).st_mtime + 2.5 - time.time()))
            cat = os.path.join(catalogs, str(n))
            rs = [R.run(f"start-up: tokenfeed, {n} llm.c shards{what}", "startup",
                        dict(tf, mode="startup", shards_dir=d, path=None, dtype_in=None, catalog_dir=cat))
                  for what in (", first open on the node", ", again (node catalog)")]
        except ValueError as e:
            rs = [{"status": "skipped", "reason": str(e)}] * 2
        for row, r in zip(rows, rs):
            row.update({k: v for k, v in r.items() if k in ("status", "reason", "first_batch_s",
                                                            "first_batch_rss_delta_mb")})
            out.append(row)
        for p in PEERS:
            if not p.shards or p.key not in args.peers:
                continue
            where = peers.get(p.key, {})
            prow: Dict[str, Any] = {"loader": p.name, "peer": p.key, "shards": n, "tokens": ntok}
            if "python" not in where:
                prow.update(status="not installed", reason=where.get("reason", "?"))
            else:
                r = R.run(f"start-up: {p.name}, {n} shards", "startup", dict(base, kind=p.loader, mode="startup",
                                                                            shards=n),
                          python=where["python"], pythonpath=where["pythonpath"])
                prow.update({k: v for k, v in r.items() if k in ("status", "reason", "first_batch_s", "prepare",
                                                                "chunks", "files", "first_batch_rss_delta_mb")})
            out.append(prow)
    if args.sparse_tokens:
        n = max(args.shards) if args.shards else 10_000
        d = os.path.join(args.cache_dir, "sparse", f"llmc-{args.sparse_tokens}-{n}")
        row = {"loader": "tokenfeed", "shards": n, "tokens": args.sparse_tokens, "sparse": True}
        try:
            data.make_sparse_llmc(d, args.sparse_tokens, n)
            r = R.run(f"start-up: tokenfeed, {human(args.sparse_tokens)} tokens in {n} sparse shards", "startup",
                      dict(tf, mode="startup", shards_dir=d, path=None, dtype_in=None))
        except (ValueError, OSError) as e:
            r = {"status": "skipped", "reason": str(e)}
        row.update({k: v for k, v in r.items() if k in ("status", "reason", "first_batch_s",
                                                        "first_batch_rss_delta_mb")})
        out.append(row)
    # the default layout, from the throughput rows (open + first batch in the same child)
    for r in R.results:
        if r.get("status") == "ok" and r["group"] in ("tokenfeed", "baseline", "peer") and \
                r["name"] in ("tokenfeed", "nanoGPT get_batch") + tuple(p.name for p in PEERS):
            out.append({"loader": r["name"], "shards": r.get("chunks") or r.get("shards") or r.get("files") or 1,
                        "tokens": ntok, "status": "ok", "first_batch_s": r["first_batch_s"], "layout": "default"})
    shutil.rmtree(catalogs, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------- restore


def _restore(R: Runner, base: Case, tf: Case, peers: Dict[str, Dict[str, Any]], have_torch: bool, args: Any,
             log: Callable[[str], None]) -> List[Dict[str, Any]]:
    B = base["batch_size"]
    out: List[Dict[str, Any]] = []

    def rows(name: str, r: Dict[str, Any], loader: str, method: str) -> None:
        method = r.get("method") or method
        if r.get("status") == "ok":
            for x in r["restore"]:
                out.append(dict(x, loader=loader, status="ok", method=method))
        else:
            out.append({"loader": loader, "status": r.get("status", "failed"), "reason": r.get("reason"),
                        "method": method})

    pos = [0, B * 10**3, B * 10**6, B * 10**9, B * 10**12]
    rows("tokenfeed", R.run("restore: tokenfeed", "restore", dict(tf, mode="restore", positions=pos)),
         "tokenfeed", "state_dict(): position only, O(1)")
    n_epoch = int(min(base_samples(base), 1 << 40))
    deep = sorted({p for p in (0, B * 100, B * 1000, B * 10_000, (int(n_epoch * 0.9) // B) * B) if p < n_epoch})
    if have_torch:
        rows("torch DataLoader", R.run("restore: torch DataLoader (replay)", "restore",
                                       dict(base, kind="torch_dataloader", mode="restore",
                                            positions=[p for p in deep if p <= B * 1000])),
             "torch DataLoader", "replay: iterate and drop the batches before the position")
    for p in PEERS:
        if not p.resumable or p.key not in args.peers:
            continue
        where = peers.get(p.key, {})
        if "python" not in where:
            out.append({"loader": p.name, "peer": p.key, "status": "not installed", "reason": where.get("reason")})
            continue
        rows(p.name, R.run(f"restore: {p.name}", "restore", dict(base, kind=p.loader, mode="restore", positions=deep),
                           python=where["python"], pythonpath=where["pythonpath"]),
             p.name, "its own state_dict()/load_state_dict() at the position")
    for x in out:
        if x.get("status") == "ok":
            log(f"    restore {x['loader']} @ {human(x['position'])}: {x['restore_s'] * 1e3:.1f} ms")
    return out


def base_samples(case: Case) -> int:
    return int((os.path.getsize(case["raw"]) // np.dtype(case["raw_dtype"]).itemsize - 1) // case["seq_len"])


# ----------------------------------------------------------------------------- larger than memory


def _larger(R: Runner, base: Case, args: Any, bi: Dict[str, Any], have_torch: bool,
            log: Callable[[str], None]) -> Dict[str, Any]:
    ram = meminfo_bytes() or 0
    size = args.big_size if args.big_size else int(ram * 1.6)
    big_dir = args.big_dir or os.path.join(args.cache_dir, "big")
    os.makedirs(big_dir, exist_ok=True)
    path = os.path.join(big_dir, "tokens.bin")
    res: Dict[str, Any] = {"bytes": size, "ram_bytes": ram, "exceeds_ram": size > ram, "path": path,
                           "seconds_per_backend": args.big_seconds}
    have = data.free_bytes(big_dir) + (os.path.getsize(path) if os.path.exists(path) else 0)
    if have < size + (2 << 30):
        res.update(status="skipped", reason=f"{human_bytes(size)} does not fit in the {human_bytes(have)} free in "
                                            f"{big_dir} with 2 GiB to spare: pass a smaller --big-size or "
                                            f"another --big-dir")
        log(f"larger than memory: {res['reason']}")
        return res
    log(f"larger than memory: {human_bytes(size)} of tokens vs {human_bytes(ram)} RAM in {big_dir}")
    try:
        made = data.make_big_file(path, size, base["vocab_size"], base["seed"], log)
        res["write"] = made
        L = base["seq_len"]
        dt = data.token_dtype(base["vocab_size"])
        item = np.dtype(dt).itemsize
        n = (size // item - 1) // L
        rng = np.random.default_rng(base["seed"])
        samples = rng.integers(0, n, size=min(n, 1 << 20), dtype=np.int64).astype(np.uint64)
        sp = os.path.join(big_dir, "samples.npy")
        np.save(sp, samples)
        res["fio"] = fio.randread(path, sample_bytes=(L + 1) * item, seq_len=L, seconds=args.fio_seconds)
        if res["fio"].get("status") == "ok":
            for x in res["fio"]["runs"]:
                log(f"    fio QD{x['iodepth']}: {x['iops']:,.0f} IOPS, {x['mb_per_s']:.0f} MB/s -> "
                    f"{human(x['tokens_per_s_limit'])} tokens/s limit")
        else:
            log(f"    fio: {res['fio'].get('reason')}")
        big = dict(base, raw=path, raw_dtype=np.dtype(dt).name, samples=sp, warmup=0, seconds=args.big_seconds,
                   cold=True, step_ms=None)
        tfc = dict(big, kind="tokenfeed_loader", path=path, dtype_in=np.dtype(dt).name, output="numpy")
        rows: List[Dict[str, Any]] = []
        backends: List[Tuple[str, Case]] = [("mmap", {"backend": "mmap"}), ("pread", {"backend": "pread"})]
        if bi.get("io_uring", {}).get("usable"):
            backends += [("io_uring", {"backend": "io_uring"}),
                         ("io_uring direct_io", {"backend": "io_uring", "direct_io": True})]
        for name, extra in backends:
            rows.append(R.run(f"larger than memory: tokenfeed backend={name}", "larger", dict(tfc, **extra)))
        if have_torch:
            rows.append(R.run("larger than memory: nanoGPT get_batch", "larger", dict(big, kind="nanogpt")))
        best = max([x["tokens_per_s_limit"] for x in res["fio"].get("runs", [])] or [0]) or None
        for r in rows:
            if r.get("status") == "ok":
                r["ratio_to_fio"] = r["tokens_per_s"] / best if best else None
        res["rows"] = rows
        res["status"] = "ok"
    finally:
        if not args.keep_big:
            for p in (path, path + ".done", path + ".tmp", os.path.join(big_dir, "samples.npy")):
                if os.path.exists(p):
                    os.remove(p)
            res["removed"] = True
            log(f"removed {path} (--keep-big keeps it for the next run)")
    return res


# ----------------------------------------------------------------------------- zstd


def _zstd_figures(native: Any, zdir: Optional[str], log: Callable[[str], None]) -> Dict[str, Any]:
    import tokenfeed

    if not zdir:
        return {"status": "skipped", "reason": "--data given: the benchmark compresses only generated data"}
    try:
        raw_bytes = sum(os.path.getsize(p) for p in data.dataset_files(native))
        z_bytes = sum(os.path.getsize(p) for p in data.dataset_files(zdir))
        zs = tokenfeed.open(zdir)
        n = min(zs.num_tokens, 1 << 26)
        step = 1 << 20
        got = 0
        t = time.perf_counter()
        for s in range(0, n, step):
            got += len(zs.tokens(s, min(n, s + step)))
        dt = time.perf_counter() - t
        r = {"status": "ok", "level": 3, "bytes_uncompressed_dataset": raw_bytes, "bytes_zstd_dataset": z_bytes,
             "ratio": raw_bytes / z_bytes, "decode_tokens_per_s": got / dt,
             "decode_mb_per_s": got * zs.dtype.itemsize / dt / 1e6,
             "method": "sequential Dataset.tokens() over the zstd dataset, one thread (C decode + copy)",
             "note": "synthetic i.i.d. Zipf tokens: entropy coding only, no repeated phrases - real "
                     "tokenized text also has LZ matches, so its ratio is typically higher"}
        log(f"zstd: ratio {r['ratio']:.3f}, decode {human(r['decode_tokens_per_s'])} tokens/s")
        return r
    except Exception as e:
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
