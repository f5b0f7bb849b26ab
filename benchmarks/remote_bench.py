"""Remote datasets: throughput, time to first batch and bytes fetched, against moto's S3 server
behind a proxy that adds latency and caps bandwidth; open of many remote shards; and, where
they install, LitData and MosaicML Streaming against the same server and proxy.

    python benchmarks/remote_bench.py                 # everything, figures on stdout
    python benchmarks/remote_bench.py --quick --json out.json
    python benchmarks/remote_bench.py --only open     # stream, open, peers
    python benchmarks/remote_bench.py --only peers --peer-python /path/to/venv/bin/python
    python benchmarks/remote_bench.py --only startup --startup-shards 1000 10000
    python benchmarks/remote_bench.py --only startup --startup-shards 10000 --startup-procs 4
    python benchmarks/remote_bench.py --only startup --startup-shards 1000 10000 --startup-procs 8 --startup-slash \
        --startup-builds before=/path/to/base/python after=python
    python benchmarks/remote_bench.py --only node --node-shards 1000 10000 --node-seconds 20

The servers run on 127.0.0.1 (tests/remote_util.py). moto is a Python server: on a small
machine it serves some tens of MB/s, so the bandwidth cap must stay below that for the cap,
not moto, to be what is measured (--cap-mbps; the run reports moto's own rate too).
Figures in docs/performance.md ("Remote").
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import tokenfeed  # noqa: E402
from remote_util import TEST_CREDENTIALS, FaultProxy, MotoServer  # noqa: E402

try:  # the Loader hands out torch tensors when torch is there: import it before any timing
    import torch  # noqa: F401
except ImportError:
    pass


def write_dataset(path: str, tokens: int, shard_tokens: int, seed: int = 0, vocab: int = 50257) -> None:
    rng = np.random.default_rng(seed)
    left = tokens
    with tokenfeed.DatasetWriter(path, vocab_size=vocab, shard_tokens=shard_tokens) as w:
        while left > 0:
            n = int(min(left, rng.integers(200, 2000)))
            w.add_document(rng.integers(0, vocab, size=n, dtype=np.uint16))
            left -= n



def write_llmc_shards(local: str, docs: Sequence[np.ndarray]) -> None:
    """One llm.c shard per document in a new directory (shard_000000.bin, ...)."""
    os.makedirs(local)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1] = 20240520, 1
    for i, d in enumerate(docs):
        header[2] = len(d)
        with open(os.path.join(local, f"shard_{i:06d}.bin"), "wb") as f:
            f.write(header.tobytes() + d.tobytes())

def upload(moto: MotoServer, bucket: str, prefix: str, local: str) -> None:
    moto.create_bucket(bucket)
    moto.upload_dir(bucket, prefix, local)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def bench_stream(moto: MotoServer, tmp: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Throughput and time to first batch through latency + a bandwidth cap."""
    out: Dict[str, Any] = {}
    cap = args.cap_mbps * 1e6
    sizes = [args.tokens // 4, args.tokens] if not args.quick else [args.tokens // 4]
    for tokens in sizes:
        name = f"ds{tokens}"
        local = os.path.join(tmp, name)
        write_dataset(local, tokens, shard_tokens=max(tokens // 8, 1 << 16))
        upload(moto, "bench", name, local)
        data_bytes = sum(os.path.getsize(os.path.join(local, f)) for f in os.listdir(local) if f.endswith(".tfs"))
        proxy = FaultProxy(moto.port, latency=args.latency_ms / 1000, bandwidth=cap)
        try:
            cache = os.path.join(tmp, f"cache-{name}")
            t0 = time.perf_counter()
            ds = tokenfeed.open(f"s3://bench/{name}/", cache_dir=cache, cache_limit=2 * data_bytes + (1 << 30),
                                endpoint_url=proxy.endpoint, chunk_size=args.chunk_mb << 20)
            t_open = time.perf_counter() - t0
            loader = tokenfeed.Loader(ds, seq_len=2048, batch_size=8, seed=0, shuffle="block", block_size=64,
                                      window_blocks=8, epochs=1)
            it = iter(loader)
            next(it)
            ttfb = time.perf_counter() - t0
            # steady state: from the first batch to the end of the epoch
            s0 = ds.cache_stats() or {}
            b0 = proxy.bytes_sent
            t1 = time.perf_counter()
            n = 1
            for _ in it:
                n += 1
            dt = time.perf_counter() - t1
            st = ds.cache_stats() or {}
            sent = proxy.bytes_sent - b0
            consumed = n * 8 * 2049 * 2
            row = {"dataset_bytes": data_bytes, "open_s": round(t_open, 3), "ttfb_s": round(ttfb, 3),
                   "batches": n, "steady_MBps": round(sent / dt / 1e6, 2), "cap_MBps": args.cap_mbps,
                   "fraction_of_cap": round(sent / dt / cap, 3),
                   "tokens_per_s": round((n - 1) * 8 * 2048 / dt), "bytes_fetched": st.get("bytes_fetched"),
                   "fetched_per_consumed": round((st.get("bytes_fetched") or 0) / consumed, 3),
                   "fetched_per_dataset": round((st.get("bytes_fetched") or 0) / data_bytes, 3),
                   "chunk_waits": st.get("chunk_waits"), "chunk_hits": st.get("chunk_hits"),
                   "requests": st.get("requests"), "waits_before_steady": s0.get("chunk_waits")}
            out[f"{data_bytes / 1e6:.0f}MB"] = row
            print(f"stream {data_bytes / 1e6:7.1f} MB: open {t_open:.2f} s, first batch {ttfb:.2f} s, steady "
                  f"{row['steady_MBps']} MB/s of a {args.cap_mbps} MB/s cap ({100 * row['fraction_of_cap']:.0f}%), "
                  f"fetched/consumed {row['fetched_per_consumed']}, fetched/dataset {row['fetched_per_dataset']}",
                  flush=True)
            del loader, it, ds
        finally:
            proxy.stop()
    return out


def bench_moto_rate(moto: MotoServer, tmp: str) -> float:
    """moto's own serving rate (MB/s) with 8 concurrent 8 MiB range requests: the ceiling."""
    import concurrent.futures

    import obstore

    data = os.urandom(64 << 20)
    moto.create_bucket("rate")
    moto.put("rate", "blob", data)
    st = moto.store("rate")
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: obstore.get_range(st, "blob", start=i << 23, end=(i + 1) << 23), range(8)))
    return 64 * 1.048576 / (time.perf_counter() - t0)


def bench_open(moto: MotoServer, tmp: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Open of a native dataset of n remote shards: time, CPU and memory of the opening process."""
    n = args.open_shards
    local = os.path.join(tmp, "many")
    rng = np.random.default_rng(1)
    with tokenfeed.DatasetWriter(local, vocab_size=50257, shard_tokens=1) as w:  # one document per shard
        for _ in range(n):
            w.add_document(rng.integers(0, 50257, size=int(rng.integers(200, 900)), dtype=np.uint16))
    shards = sum(1 for f in os.listdir(local) if f.endswith(".tfs"))
    t0 = time.perf_counter()
    upload(moto, "many", "ds", local)
    out: Dict[str, Any] = {"shards": shards, "upload_s": round(time.perf_counter() - t0, 1)}
    for label, latency in (("direct", None), (f"{args.latency_ms:g}ms", args.latency_ms / 1000)):
        proxy = FaultProxy(moto.port, latency=latency) if latency is not None else None
        endpoint = proxy.endpoint if proxy else moto.endpoint
        try:
            code = ("import time, resource, tokenfeed\n"
                    "def rss(): return int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])\n"
                    "r0 = rss(); c0 = resource.getrusage(resource.RUSAGE_SELF)\n"
                    "t = time.perf_counter()\n"
                    f"ds = tokenfeed.open('s3://many/ds/', cache_dir={os.path.join(tmp, 'c-' + label)!r}, "
                    f"endpoint_url={endpoint!r}, fetch_threads=64)\n"
                    "dt = time.perf_counter() - t\n"
                    "c1 = resource.getrusage(resource.RUSAGE_SELF)\n"
                    "cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime\n"
                    "print(dt, cpu, rss() - r0, rss(), ds.num_files, ds.cache_stats()['requests'])\n")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=3000)
            if r.returncode != 0:
                out[label] = {"error": r.stderr[-400:]}
                continue
            dt, cpu, drss, rss, nf, req = r.stdout.split()
            out[label] = {"open_s": round(float(dt), 2), "cpu_s": round(float(cpu), 2),
                          "rss_added_MB": round(int(drss) / 1024, 1), "rss_MB": round(int(rss) / 1024, 1),
                          "files": int(nf), "requests": int(req)}
            print(f"open {shards} shards ({label}): {float(dt):.2f} s wall, {float(cpu):.2f} s CPU, "
                  f"+{int(drss) / 1024:.0f} MB RSS, {req} requests", flush=True)
        finally:
            if proxy:
                proxy.stop()
    return out


# ---- start-up: the metadata requests of a node's processes ----------------------------

STARTUP_CHILD = r"""
import json, sys, time, tokenfeed
import torch  # a training process has imported it before it makes its loader: not start-up's to pay
url, cache, endpoint = sys.argv[1], sys.argv[2], sys.argv[3]
rank, world = int(sys.argv[4]), int(sys.argv[5])  # each process of the node reads its own batches
t = time.perf_counter()
ds = tokenfeed.open(url, cache_dir=cache, endpoint_url=endpoint, fetch_threads=16)
opened = time.perf_counter() - t
meta = ds.cache_stats()["requests"]
loader = tokenfeed.Loader(ds, seq_len=512, batch_size=8, seed=0, shuffle="block", dp_rank=rank, dp_size=world)
next(iter(loader))
print(json.dumps({"open_s": opened, "first_batch_s": time.perf_counter() - t, "metadata_requests": meta,
                  "files": ds.num_files}))
"""


def _startup_run(url: str, proxy: FaultProxy, cache: str, procs: int, env: Dict[str, str]) -> Dict[str, Any]:
    """procs processes of one node opening url together on the cache, each to its first batch.
    Requests are counted at the proxy: listing pages (a GET of the bucket itself), HEADs and the
    other GETs (ranged reads of objects)."""
    proxy.reset_counts()
    t = time.perf_counter()
    ps = [subprocess.Popen([sys.executable, "-c", STARTUP_CHILD, url, cache, proxy.endpoint, str(rank), str(procs)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for rank in range(procs)]
    res = []
    for p in ps:
        o, e = p.communicate(timeout=3600)
        if p.returncode != 0:
            return {"error": e[-400:]}
        res.append(json.loads(o.strip().splitlines()[-1]))
    wall = time.perf_counter() - t
    lists = sum(v for k, v in proxy.gets.items() if k[0].strip("/").count("/") == 0)
    return {"wall_s": round(wall, 2), "requests": sum(proxy.requests.values()), "lists": lists,
            "heads": proxy.requests.get("HEAD", 0), "gets": proxy.requests.get("GET", 0) - lists,
            "metadata_requests": sum(r["metadata_requests"] for r in res),
            "open_s_max": round(max(r["open_s"] for r in res), 2),
            "first_batch_s_max": round(max(r["first_batch_s"] for r in res), 2)}


def _builds(args: argparse.Namespace) -> Dict[str, str]:
    """The builds to start the processes with: NAME=PYTHONPATH pairs (--startup-builds), else
    --startup-pythonpath, else this process's path."""
    if args.startup_builds:
        return dict(b.split("=", 1) for b in args.startup_builds)
    return {"now": args.startup_pythonpath or os.pathsep.join(sys.path)}


def _startup_variants(what: str, url: str, proxy: FaultProxy, tmp: str, key: str, variants: Dict[str, Any],
                      args: argparse.Namespace, env: Dict[str, str]) -> Dict[str, Any]:
    """Fresh cache, restart, a restart whose node listing is older than it trusts
    (TOKENFEED_LISTING_MAX_AGE=0), and the node's processes together, for each variant (a
    callable that prepares the bucket for it) and each build, one after the other on the same
    data and server."""
    row: Dict[str, Any] = {}
    for v, prepare in variants.items():
        prepare()
        for build, path in _builds(args).items():
            benv = dict(env, PYTHONPATH=path)
            sub: Dict[str, Any] = {}
            cache = os.path.join(tmp, f"startup-cache-{key}-{v}-{build}")
            sub["fresh"] = _startup_run(url, proxy, cache, 1, benv)
            sub["restart"] = _startup_run(url, proxy, cache, 1, benv)
            if build == list(_builds(args))[-1]:  # (builds before the listing's age rule have none)
                sub["restart_listing_too_old"] = _startup_run(url, proxy, cache, 1,
                                                              dict(benv, TOKENFEED_LISTING_MAX_AGE="0"))
            if args.startup_procs > 1:
                sub[f"node_{args.startup_procs}"] = _startup_run(
                    url, proxy, os.path.join(tmp, f"startup-node-{key}-{v}-{build}"), args.startup_procs, benv)
            for k, r in sub.items():
                print(f"start-up, {what}, {v.replace('_', ' ')}, {build}, {k}: " + (r["error"] if "error" in r else
                      f"{r['wall_s']} s wall (open {r['open_s_max']} s, first batch {r['first_batch_s_max']} s), "
                      f"{r['requests']} requests: {r['lists']} listing pages, {r['heads']} HEAD, {r['gets']} GET "
                      f"({r['metadata_requests']} at open)"), flush=True)
            row[f"{v}:{build}"] = sub
    return row


def bench_startup(moto: MotoServer, tmp: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Requests at start-up, counted at the proxy (which adds the latency): one process with a
    fresh cache, a restart with the same cache, and N processes of one node started together on
    a fresh shared cache.

    native: a tokenfeed dataset as written (with its catalog, tokenfeed.catalog, which a remote
    open reads instead of every shard's header) and, with --startup-catalog both, once its
    catalog is deleted from the bucket (every shard's header read at open, as for a dataset
    written before tokenfeed wrote catalogs). The dataset's URL has no trailing "/" unless
    --startup-slash is given (then the core lists the directory to find what it holds, once
    per node).

    glob: a glob of llm.c objects (s3://startup/globN/*.bin, one document each), with the set's
    catalog that `tokenfeed index` stores beside them and, with --startup-catalog both, without
    it (every object's header read once per node)."""
    out: Dict[str, Any] = {}
    env = dict(os.environ)
    which = {"both": ["catalog", "no_catalog"], "with": ["catalog"], "without": ["no_catalog"]}[args.startup_catalog]
    kinds = set(args.startup_kinds.split(","))
    for n in args.startup_shards:
        rng = np.random.default_rng(2)
        docs = [rng.integers(0, 50257, size=int(rng.integers(200, 900)), dtype=np.uint16) for _ in range(n)]
        row: Dict[str, Any] = {"shards": n}
        if "native" in kinds:
            local = os.path.join(tmp, f"startup-{n}")
            with tokenfeed.DatasetWriter(local, vocab_size=50257, shard_tokens=1) as w:  # one document per shard
                for d in docs:
                    w.add_document(d)
            t0 = time.perf_counter()
            upload(moto, "startup", f"ds{n}", local)
            row["upload_s"] = round(time.perf_counter() - t0, 1)
            proxy = FaultProxy(moto.port, latency=args.latency_ms / 1000)
            variants = {"catalog": lambda: None,
                        "no_catalog": lambda: moto.delete("startup", f"ds{n}/tokenfeed.catalog")}
            try:
                ds_url = f"s3://startup/ds{n}" + ("/" if args.startup_slash else "")
                row.update(_startup_variants(f"{n} shards", ds_url, proxy, tmp, f"ds{n}",
                                             {v: variants[v] for v in which}, args, env))
            finally:
                proxy.stop()
        if "glob" in kinds:
            local = os.path.join(tmp, f"startup-glob-{n}")
            write_llmc_shards(local, docs)
            t0 = time.perf_counter()
            upload(moto, "startup", f"glob{n}", local)
            url = f"s3://startup/glob{n}/*.bin"
            t1 = time.perf_counter()
            name = tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)
            glob_row: Dict[str, Any] = {"upload_s": round(t1 - t0, 1), "index_s": round(time.perf_counter() - t1, 1)}
            print(f"start-up, {n} llm.c objects: tokenfeed index {glob_row['index_s']} s", flush=True)
            proxy = FaultProxy(moto.port, latency=args.latency_ms / 1000)
            variants = {"catalog": lambda: None,
                        "no_catalog": lambda: moto.delete("startup", name.split("/", 3)[3])}
            try:
                glob_row.update(_startup_variants(f"{n} llm.c objects (glob)", url, proxy, tmp, f"glob{n}",
                                                  {v: variants[v] for v in which}, args, env))
            finally:
                proxy.stop()
            row["glob"] = glob_row
        out[str(n)] = row
    return out


# ---- node: a node's processes reading together, to the first batch, steadily, to close --

NODE_CHILD = r"""
import json, sys, time, tokenfeed
import torch  # noqa: F401  (a training process has it imported already)
url, cache, endpoint = sys.argv[1], sys.argv[2], sys.argv[3]
rank, world, secs = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
t = time.perf_counter()
ds = tokenfeed.open(url, cache_dir=cache, endpoint_url=endpoint, fetch_threads=16)
loader = tokenfeed.Loader(ds, seq_len=512, batch_size=8, seed=0, shuffle="block", dp_rank=rank, dp_size=world)
it = iter(loader)
next(it)
print(json.dumps({"first_batch_s": time.perf_counter() - t}), flush=True)
sys.stdin.readline()  # every process of the node has its first batch
t = time.perf_counter()
n = 1
while time.perf_counter() - t < secs:
    try:
        next(it)
    except StopIteration:
        break
    n += 1
print(json.dumps({"batches": n}), flush=True)
sys.stdin.readline()  # every process has read for secs
t = time.perf_counter()
loader.close()
print(json.dumps({"close_s": time.perf_counter() - t}), flush=True)
"""


def _node_run(url: str, proxy: FaultProxy, cache: str, procs: int, secs: float, env: Dict[str, str]) -> Dict[str, Any]:
    """procs processes of one node (distinct dp ranks, one cache) reading url: the node's
    requests and bytes (at the proxy) until every process has its first batch, during secs of
    steady reading, and until every close() returned; the most any byte range was fetched."""
    proxy.reset_counts()
    ps = [subprocess.Popen([sys.executable, "-c", NODE_CHILD, url, cache, proxy.endpoint, str(rank), str(procs),
                            str(secs)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for rank in range(procs)]
    out: Dict[str, Any] = {}
    prev = (0, 0)
    try:
        for phase, key in (("first_batch", "first_batch_s"), ("steady", "batches"), ("close", "close_s")):
            vals = []
            for p in ps:
                line = p.stdout.readline() if p.stdout else ""
                if not line:
                    err = p.stderr.read() if p.stderr else ""
                    return {"error": f"{phase}: {err[-400:]}"}
                vals.append(json.loads(line)[key])
            req, sent = sum(proxy.requests.values()), proxy.bytes_sent
            out[phase] = {"requests": req - prev[0], "MB": round((sent - prev[1]) / 1e6, 2)}
            prev = (req, sent)
            if phase == "first_batch":
                out[phase]["s_max"] = round(max(vals), 2)
            elif phase == "steady":
                out[phase]["batches"] = sum(vals)
            else:
                out[phase]["s_max"] = round(max(vals), 3)
            for p in ps:
                if p.stdin and phase != "close":
                    p.stdin.write("go\n")
                    p.stdin.flush()
        for p in ps:
            p.wait(600)
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()
    ranged = [v for k, v in proxy.gets.items() if k[1]]
    out["ranges"] = len(ranged)
    out["most_fetches_of_a_range"] = max(ranged) if ranged else 0
    out["ranges_fetched_again"] = sorted(f"{k[0]} {k[1]}: {v}" for k, v in proxy.gets.items() if k[1] and v > 1)[:4]
    return out


def bench_node(moto: MotoServer, tmp: str, args: argparse.Namespace) -> Dict[str, Any]:
    """A node of --node-procs processes with distinct ranks on one fresh cache, for each size,
    kind (native: a tokenfeed dataset of one-document shards; llm.c: a glob of llm.c objects)
    and catalog (with: the dataset's own, or the set's from tokenfeed index; none: deleted;
    --startup-catalog picks)."""
    out: Dict[str, Any] = {}
    env = dict(os.environ)
    kinds = set(args.startup_kinds.split(","))
    for n in args.node_shards:
        rng = np.random.default_rng(2)
        docs = [rng.integers(0, 50257, size=int(rng.integers(200, 900)), dtype=np.uint16) for _ in range(n)]
        row: Dict[str, Any] = {}
        sets = []
        if "native" in kinds:
            local = os.path.join(tmp, f"node-{n}")
            with tokenfeed.DatasetWriter(local, vocab_size=50257, shard_tokens=1) as w:
                for d in docs:
                    w.add_document(d)
            upload(moto, "node", f"ds{n}", local)
            sets.append(("native", f"s3://node/ds{n}", f"ds{n}/tokenfeed.catalog"))
        if "glob" in kinds:
            local = os.path.join(tmp, f"node-glob-{n}")
            write_llmc_shards(local, docs)
            upload(moto, "node", f"glob{n}", local)
            url = f"s3://node/glob{n}/*.bin"
            name = tokenfeed.build_catalog(url, endpoint_url=moto.endpoint)
            sets.append(("llm.c", url, name.split("/", 3)[3]))
        proxy = FaultProxy(moto.port, latency=args.latency_ms / 1000)
        try:
            for kind, url, catalog in sets:
                for variant in {"both": ("catalog", "none"), "with": ("catalog",),
                                "without": ("none",)}[getattr(args, "startup_catalog", "both")]:
                    if variant == "none":
                        moto.delete("node", catalog)
                    cache = os.path.join(tmp, f"node-cache-{n}-{kind}-{variant}")
                    r = _node_run(url, proxy, cache, args.node_procs, args.node_seconds, env)
                    row[f"{kind}, {variant}"] = r
                    print(f"node of {args.node_procs}, {n} objects, {kind}, catalog {variant}: " +
                          (r["error"] if "error" in r else
                           f"first batch {r['first_batch']['requests']} requests {r['first_batch']['MB']} MB "
                           f"({r['first_batch']['s_max']} s); {args.node_seconds:g} s steady "
                           f"{r['steady']['requests']} requests {r['steady']['MB']} MB; close "
                           f"{r['close']['requests']} requests {r['close']['MB']} MB ({r['close']['s_max']} s); "
                           f"{r['ranges']} ranges, each fetched at most {r['most_fetches_of_a_range']}x"),
                          flush=True)
        finally:
            proxy.stop()
        out[str(n)] = row
    return out


# ---- peers: LitData and MosaicML Streaming, run by another Python (--peer-python) --------

PEER_WRITE = r"""
import sys, os, numpy as np
kind, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
tokens = np.fromfile(src, dtype=np.uint16)
if kind == "litdata":
    # LitData's TokensLoader format: one tensor per sample (int32: torch has no uint16 here)
    import litdata as ld
    from litdata.streaming.item_loader import TokensLoader
    import torch
    parts = out + "-parts"
    os.makedirs(parts, exist_ok=True)
    paths = []
    step = 2048 * 64
    for k, i in enumerate(range(0, len(tokens) - 2048, step)):
        p = os.path.join(parts, f"{k:05d}.npy")
        np.save(p, tokens[i:i + step + 1])
        paths.append(p)
    def fn(path):
        a = np.load(path)
        for j in range(0, len(a) - 2048, 2048):
            yield torch.from_numpy(a[j:j + 2049].astype(np.int32))
    ld.optimize(fn=fn, inputs=paths, output_dir=out, chunk_bytes="8MB", item_loader=TokensLoader(), num_workers=1,
                start_method="fork", mode="overwrite")
else:
    from streaming import MDSWriter
    n = (len(tokens) - 1) // 2048
    with MDSWriter(out=out, columns={"tokens": "ndarray:uint16"}, size_limit="8mb") as w:
        for i in range(n):
            w.write({"tokens": tokens[i * 2048:i * 2048 + 2049]})
"""

PEER_READ = r"""
import sys, os, time, json, tempfile
kind, url, endpoint, cache = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
import torch
t0 = time.perf_counter()
if kind == "litdata":
    os.environ["AWS_ENDPOINT_URL"] = endpoint  # its S3 client (obstore or boto3) reads these
    os.environ["AWS_ALLOW_HTTP"] = "true"
    from litdata import StreamingDataset, StreamingDataLoader
    from litdata.streaming.item_loader import TokensLoader
    ds = StreamingDataset(url, item_loader=TokensLoader(block_size=2049), shuffle=True, cache_dir=cache,
                          storage_options={"endpoint_url": endpoint})
    dl = StreamingDataLoader(ds, batch_size=8, num_workers=0)
else:
    os.environ["S3_ENDPOINT_URL"] = endpoint
    from streaming import StreamingDataset
    ds = StreamingDataset(remote=url, local=cache, shuffle=True, batch_size=8)
    dl = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=0)
it = iter(dl)
next(it)
ttfb = time.perf_counter() - t0
t1 = time.perf_counter()
n = 1
for _ in it:
    n += 1
print(json.dumps({"ttfb_s": ttfb, "batches": n, "steady_s": time.perf_counter() - t1}))
"""


def bench_peers(moto: MotoServer, tmp: str, args: argparse.Namespace) -> Dict[str, Any]:
    """LitData and MosaicML Streaming over the same tokens through the same proxy."""
    py = args.peer_python
    out: Dict[str, Any] = {}
    if not py:
        return {"skipped": "no --peer-python (a Python with litdata and mosaicml-streaming installed)"}
    tokens = args.tokens // 4 if args.quick else args.tokens
    rng = np.random.default_rng(0)
    flat = rng.integers(0, 50257, size=tokens, dtype=np.uint16)
    src = os.path.join(tmp, "flat.bin")
    flat.tofile(src)
    env = dict(os.environ)
    cap = args.cap_mbps * 1e6
    for kind in ("litdata", "mosaic"):
        local = os.path.join(tmp, f"peer-{kind}")
        r = subprocess.run([py, "-c", PEER_WRITE, kind, src, local], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            out[kind] = {"error": "write: " + r.stderr[-600:]}
            print(f"{kind}: could not write its format: {r.stderr[-300:]}", flush=True)
            continue
        upload(moto, f"peer-{kind}", "data", local)
        data_bytes = sum(os.path.getsize(os.path.join(dp, f)) for dp, _d, fs in os.walk(local) for f in fs)
        proxy = FaultProxy(moto.port, latency=args.latency_ms / 1000, bandwidth=cap)
        try:
            cache = os.path.join(tmp, f"peer-cache-{kind}")
            r = subprocess.run([py, "-c", PEER_READ, kind, f"s3://peer-{kind}/data", proxy.endpoint, cache],
                               capture_output=True, text=True, env=env, timeout=3600)
            if r.returncode != 0:
                out[kind] = {"error": "read: " + r.stderr[-600:]}
                print(f"{kind}: failed to read: {r.stderr[-300:]}", flush=True)
                continue
            res = json.loads(r.stdout.strip().splitlines()[-1])
            consumed = res["batches"] * 8 * 2049 * 2
            res.update(dataset_bytes=data_bytes, proxy_bytes=proxy.bytes_sent,
                       fetched_per_consumed=round(proxy.bytes_sent / consumed, 3),
                       steady_MBps=round(proxy.bytes_sent / (res["steady_s"] + res["ttfb_s"]) / 1e6, 2),
                       fraction_of_cap=round(proxy.bytes_sent / (res["steady_s"] + res["ttfb_s"]) / cap, 3),
                       tokens_per_s=round((res["batches"] - 1) * 8 * 2048 / max(res["steady_s"], 1e-9)))
            out[kind] = res
            print(f"{kind}: first batch {res['ttfb_s']:.2f} s, {res['steady_MBps']} MB/s of a {args.cap_mbps} MB/s "
                  f"cap ({100 * res['fraction_of_cap']:.0f}%), fetched/consumed {res['fetched_per_consumed']}",
                  flush=True)
        finally:
            proxy.stop()
    return out


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller datasets, fewer shards")
    ap.add_argument("--tokens", type=int, default=None, help="tokens of the larger streamed dataset")
    ap.add_argument("--cap-mbps", type=float, default=16.0, help="bandwidth cap of the proxy, MB/s")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="latency the proxy adds to every request")
    ap.add_argument("--chunk-mb", type=int, default=8, help="chunk size, MiB")
    ap.add_argument("--open-shards", type=int, default=None, help="shards for the open benchmark")
    ap.add_argument("--startup-shards", type=int, nargs="+", default=None,
                    help="shard counts for the start-up requests (default 1000; --quick 100)")
    ap.add_argument("--startup-procs", type=int, default=16, help="processes of the node in the start-up group")
    ap.add_argument("--startup-catalog", choices=["both", "with", "without"], default="both",
                    help="start-up with the dataset's catalog, without it (deleted from the bucket), or both")
    ap.add_argument("--startup-kinds", default="native,glob",
                    help="comma list of: native (a tokenfeed dataset), glob (a glob of llm.c objects)")
    ap.add_argument("--startup-pythonpath", default="",
                    help="run the start-up children with this PYTHONPATH (another build, for a before/after)")
    ap.add_argument("--startup-builds", nargs="+", default=None,
                    help="NAME=PYTHONPATH of each build to start the processes with, run in turn on the same data")
    ap.add_argument("--startup-slash", action="store_true",
                    help="open the native dataset by its directory URL ending in '/' (as users write it)")
    ap.add_argument("--node-shards", type=int, nargs="+", default=None,
                    help="object counts for the node benchmark (default 1000; --quick 100)")
    ap.add_argument("--node-procs", type=int, default=8, help="processes of the node (distinct dp ranks)")
    ap.add_argument("--node-seconds", type=float, default=20.0, help="seconds of steady reading per process")
    ap.add_argument("--only", default="", help="comma list of: stream, open, startup, node, peers")
    ap.add_argument("--peer-python", help="a Python with litdata and mosaicml-streaming (run for the peers)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.tokens is None:
        args.tokens = 25_000_000 if args.quick else 100_000_000
    if args.open_shards is None:
        args.open_shards = 1000 if args.quick else 10_000
    if args.startup_shards is None:
        args.startup_shards = [100] if args.quick else [1000]
    if args.node_shards is None:
        args.node_shards = [100] if args.quick else [1000]
    only = set(filter(None, args.only.split(",")))
    os.environ.update(TEST_CREDENTIALS)
    tmp = tempfile.mkdtemp(prefix="tf-remote-bench-")
    moto = MotoServer()
    results: Dict[str, Any] = {"latency_ms": args.latency_ms, "cap_MBps": args.cap_mbps, "chunk_MiB": args.chunk_mb,
                               "machine": f"{os.cpu_count()} cores"}
    try:
        results["moto_MBps"] = round(bench_moto_rate(moto, tmp), 1)
        print(f"moto alone: {results['moto_MBps']} MB/s", flush=True)
        if not only or "stream" in only:
            results["stream"] = bench_stream(moto, tmp, args)
        if not only or "open" in only:
            results["open"] = bench_open(moto, tmp, args)
        if not only or "startup" in only:
            results["startup"] = bench_startup(moto, tmp, args)
        if not only or "node" in only:
            results["node"] = bench_node(moto, tmp, args)
        if not only or "peers" in only:
            results["peers"] = bench_peers(moto, tmp, args)
    finally:
        moto.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
