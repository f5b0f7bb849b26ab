#!/usr/bin/env python3
"""Replay the attacks on the loader, the writers and the cache end to end, each in a fresh
process, against the package as found on PYTHONPATH (or installed).

    sudo env PYTHONPATH=$PWD/python python tests/faults/attack.py          # every attack
    PYTHONPATH=$PWD/python python tests/faults/attack.py 1 4 9              # some of them

Every server is on 127.0.0.1 (moto's S3 server, the fault-injecting proxy and the small
http servers of tests/remote_util.py and the tests). Each attack runs in its own process
group with a 60 s limit; one that runs over is killed and counts as a hang reproduced.
Prints one line per attack, ``N name: held (what was seen)`` or ``N name: REPRODUCED
(...)``, and exits 0 only if every attack held. Run as root, the attacks of another local
user run as ``nobody`` and the full cache disk is a 20 MiB tmpfs; as an ordinary user the
attacker is the same user and attack 9, which needs ``mount``, says INCONCLUSIVE (not
held). ``ATTACK_VERBOSE=1`` prints the stderr of an attack that did not hold. Not part of
CI: it needs root for some cases and takes a few minutes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from typing import Callable, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)
# the helpers at the top of tests/ and the test modules whose fixtures the attacks reuse
TEST_PATH = [TESTS] + [os.path.join(TESTS, d) for d in ("sources", "remote")]
LIMIT = 60.0


class Reproduced(Exception):
    pass


def note(what: str) -> None:
    """Progress on stderr (shown with ATTACK_VERBOSE=1 when an attack does not hold)."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Reproduced(what)


def child_env() -> Dict[str, str]:
    from remote_util import TEST_CREDENTIALS
    env = dict(os.environ, **TEST_CREDENTIALS)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH")) if p)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "TOKENFEED_FAULT_CACHE",
              "TOKENFEED_FAULT_DELAY_MS", "TOKENFEED_FAULT_TMP_NAME", "TOKENFEED_FAULT_MAP_LIMIT"):
        env.pop(k, None)
    return env


def moto_dataset(tmp: str, n_docs: int = 200) -> Tuple[object, str]:
    from remote_util import MotoServer, write_dataset
    m = MotoServer()
    m.create_bucket("attack")
    write_dataset(os.path.join(tmp, "src"), n_docs)
    m.upload_dir("attack", "ds", os.path.join(tmp, "src"))
    return m, "s3://attack/ds/"


def moto_llmc_set(tmp: str, seed: int, count: int, name: str) -> Tuple[object, List[object]]:
    """count llm.c shards of 5,000 tokens (names from the format string name) uploaded under
    s3://attack/tokens/ of a fresh moto server: the server and the shards' tokens."""
    import numpy as np
    from conftest import write_llmc
    from remote_util import MotoServer
    m = MotoServer()
    m.create_bucket("attack")
    d = os.path.join(tmp, "tokens")
    os.makedirs(d)
    rng = np.random.default_rng(seed)
    shards = [rng.integers(0, 50000, size=5000, dtype=np.uint16) for _ in range(count)]
    for i, sh in enumerate(shards):
        write_llmc(os.path.join(d, name.format(i)), sh, 1)
    m.upload_dir("attack", "tokens", d)
    return m, shards


def run_script(code: str, args: List[str], **kw) -> subprocess.Popen:
    # SIGINT raises KeyboardInterrupt in the child even when this harness was started with it
    # ignored (a background job), which children inherit
    code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n" + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", code] + args, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


# --------------------------------------------------------------------------- the attacks


def a1_next_stalled_store(tmp: str) -> str:
    import tokenfeed
    from remote_util import FaultProxy
    m, url = moto_dataset(tmp)
    p = FaultProxy(m.port, stall_seconds=30)
    ds = tokenfeed.open(url, cache_dir=os.path.join(tmp, "cache"), cache_limit="64MB", endpoint_url=p.endpoint,
                        chunk_size=64 << 10, request_timeout=1.0, max_attempts=2)
    p.plan(*["stall"] * 400, path_contains=".tfs")
    loader = tokenfeed.Loader(ds, seq_len=128, batch_size=4, seed=9, shuffle="full")
    t0 = time.monotonic()
    try:
        next(iter(loader))
    except TimeoutError as e:
        dt = time.monotonic() - t0
        check(".tfs" in str(e), f"TimeoutError without the object: {e}")
        return f"TimeoutError after {dt:.1f} s, {sum(p.requests.values())} requests: {str(e)[:90]}"
    raise Reproduced("next() returned a batch from a store that never answers")


def ended(proc: subprocess.Popen, what: str, sigint: bool, limit: float = 20) -> Tuple[float, str, str]:
    """(Ctrl-C, if sigint, then) wait at most limit s for proc to end: (seconds, stdout, stderr)."""
    t0 = time.monotonic()
    if sigint:
        proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise Reproduced(f"{what}: still running {limit:.0f} s later")
    return time.monotonic() - t0, out, err


def a2_exit_without_close(tmp: str) -> str:
    import test_remote_hangs
    from remote_util import FaultProxy
    m, url = moto_dataset(tmp)
    p = FaultProxy(m.port, latency=0.5)
    times = []
    for i, how in enumerate(("exit", "exit", "exit", "loop")):
        proc = run_script(test_remote_hangs._EXIT_CHILD, [url, os.path.join(tmp, f"cache{i}"), p.endpoint, how])
        line = proc.stdout.readline().strip()
        check(line == "got", f"no first batch: {proc.stderr.read()[-300:] if proc.poll() is not None else line}")
        dt, _, err = ended(proc, "script ended without close()" if how == "exit" else "Ctrl-C in the loop",
                           how == "loop")
        times.append(dt)
        if how == "exit":
            check(proc.returncode == 0, f"exit code {proc.returncode}: {err[-300:]}")
        else:
            check("KeyboardInterrupt" in err, f"Ctrl-C ended with {proc.returncode} without KeyboardInterrupt")
    return (f"3 exits without close() in {', '.join(f'{t:.1f}' for t in times[:3])} s; "
            f"Ctrl-C in the loop ended in {times[3]:.1f} s")


_SIGINT_TOKENS = """
    import sys, tokenfeed
    ds = tokenfeed.open(sys.argv[1], cache_dir=sys.argv[2], cache_limit="64MB", endpoint_url=sys.argv[3],
                        chunk_size=64 << 10, request_timeout=3, max_attempts=10, deadline=600)
    print("reading", flush=True)
    sys.stdin.readline()          # the parent stalls the proxy first
    try:
        ds.tokens(0, ds.num_tokens)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(7)
"""


def interrupted(proc: subprocess.Popen, what: str, limit: float = 25) -> Tuple[float, float, str, str]:
    """Ctrl-C, then (seconds until the child printed "interrupted", seconds until it ended,
    stdout, stderr)."""
    got: List[float] = []
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)

    def read() -> None:
        line = proc.stdout.readline()
        if line.strip() == "interrupted":
            got.append(time.monotonic() - t0)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(limit)
    _, out, err = ended(proc, what, False, max(1.0, limit - (time.monotonic() - t0)))
    check(bool(got), f"{what}: no KeyboardInterrupt (exit {proc.returncode}): {err[-300:]}")
    return got[0], time.monotonic() - t0, out, err


def a3_ctrl_c_remote_open(tmp: str) -> str:
    from remote_util import FaultProxy
    import test_remote_hangs
    from test_remote_hangs import _Silent
    s = _Silent()
    seen: List[str] = []
    worst = 0.0
    # request_timeout=3, max_attempts=10: a prefix; then the default options (request_timeout
    # 20 s): a prefix (listed by the package), a glob (listed too) and one object (whose sizes
    # the C core asks on its fetch threads)
    runs = [("prefix, request_timeout=3", ["3", "10"], "s3://bucket/ds/"),
            ("prefix", ["default", "0"], "s3://bucket/ds/"),
            ("glob", ["default", "0"], "s3://bucket/ds/*.bin"),
            ("one object", ["default", "0"], "s3://bucket/ds/shard.bin")]
    for i, (what, limits, url) in enumerate(runs):
        n = len(s.conns)
        # the child frees the interrupted open's store, then ends (stdin at its end)
        proc = run_script(test_remote_hangs._HELD_CHILD, [url, os.path.join(tmp, f"c{i}"), s.endpoint] + limits,
                          stdin=subprocess.DEVNULL)
        check(proc.stdout.readline().strip() == "opening", "the child did not start")
        note(f"open ({what}): waiting for the connection")
        for _ in range(200):
            if len(s.conns) > n:
                break
            time.sleep(0.05)
        check(len(s.conns) > n, f"open ({what}) never reached the server")
        time.sleep(0.5)
        t_int, t_end, out, err = interrupted(proc, f"Ctrl-C in open ({what})")
        note(f"open ({what}): interrupted in {t_int:.2f} s, ended in {t_end:.2f} s")
        check(proc.returncode == 0, f"open ({what}): exit {proc.returncode}: {err[-300:]}")
        seen.append(f"{t_int:.2f} s in open ({what}; the process ended {t_end:.2f} s after SIGINT)")
        worst = max(worst, t_int)
    s.stop()
    # Dataset.tokens with every request stalled
    m, url = moto_dataset(tmp)
    note("tokens: moto up")
    p = FaultProxy(m.port, stall_seconds=60)
    proc = run_script(_SIGINT_TOKENS, [url, os.path.join(tmp, "c9"), p.endpoint], stdin=subprocess.PIPE)
    if proc.stdout.readline().strip() != "reading":
        raise Reproduced(f"tokens: no open: {proc.stderr.read()[-300:]}")
    note("tokens: opened")
    p.plan(*["stall"] * 400, path_contains=".tfs")
    n0 = sum(p.requests.values())
    proc.stdin.write("go\n")
    proc.stdin.flush()
    for _ in range(200):
        if sum(p.requests.values()) > n0:
            break
        time.sleep(0.05)
    time.sleep(0.3)
    note(f"tokens: {sum(p.requests.values()) - n0} requests since, sending SIGINT")
    t_int, t_end, out, err = interrupted(proc, "Ctrl-C in Dataset.tokens")
    check(proc.returncode == 7, f"tokens: exit {proc.returncode}: {err[-300:]}")
    seen.append(f"{t_int:.2f} s in Dataset.tokens (ended {t_end:.2f} s after SIGINT)")
    worst = max(worst, t_int)
    text = "KeyboardInterrupt " + ", ".join(seen)
    check(worst < 2.0, "the interrupt waits for the request in flight: " + text)
    return text


def a4_two_converts(tmp: str) -> str:
    import numpy as np
    import tokenfeed
    src = os.path.join(tmp, "src")
    rng = np.random.default_rng(1)
    with tokenfeed.DatasetWriter(src, vocab_size=50000, shard_tokens=200_000) as w:
        for _ in range(60):
            w.add_documents([rng.integers(0, 50000, size=1000, dtype=np.uint16) for _ in range(100)])
    local = tokenfeed.open(src)
    out = os.path.join(tmp, "out")
    cmd = [sys.executable, "-m", "tokenfeed", "convert", src, out]
    first = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = os.path.join(out, ".tokenfeed-convert.lock")
    while first.poll() is None and not (os.path.exists(lock) and any(n.endswith(".tmp") for n in os.listdir(out))):
        time.sleep(0.002)
    # the first run is paused mid-conversion (a job held by its scheduler, a slow disk) while
    # the same job starts again
    first.send_signal(signal.SIGSTOP)
    if first.poll() is not None:
        raise Reproduced("inconclusive: the first conversion ended before a second could start")
    try:
        second = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=40)
    finally:
        first.send_signal(signal.SIGCONT)
    second_ran_while_first = True
    o1, e1 = first.communicate(timeout=50)
    check(first.returncode == 0, f"the first run failed: {e1[-300:]}")
    if second_ran_while_first:
        check(second.returncode != 0 and "another process is writing here" in second.stderr,
              f"the second run was not refused: rc {second.returncode} {second.stderr[-200:]}")
    got = tokenfeed.open(out)
    check(got.num_tokens == local.num_tokens and got.num_documents == local.num_documents,
          "the first run's output does not hold the source")
    check(np.array_equal(got.tokens(0, got.num_tokens), local.tokens(0, local.num_tokens)),
          "the first run's output differs from its source")
    msg = second.stderr.strip().splitlines()[-1] if second.stderr.strip() else ""
    return f"second run exit {second.returncode}: \"{msg[:80]}...\"; first run exit 0, output intact"


def a5_planted_symlinks(tmp: str) -> str:
    import numpy as np
    import tokenfeed
    from test_security import as_attacker, precious, shared_dir
    from pathlib import Path
    out = shared_dir(os.path.join(tmp, "team", "ds"))
    victim = precious(Path(tmp))
    docs = [np.arange(100, dtype=np.uint16) + j for j in range(8)]
    w = tokenfeed.DatasetWriter(out, vocab_size=1000, shard_tokens=100)
    w.add_document(docs[0])
    w.add_document(docs[1])
    names = [n for n in os.listdir(out) if n.startswith("shard-")]
    check(bool(names), "no shard renamed into place after two documents")
    run = names[0].split("-")[1]

    def plant(dfd: int) -> None:
        for k in range(2, 10):
            os.symlink(victim, f".shard-{run}-{k:05d}.tfs.tmp", dir_fd=dfd)
        for k in range(4):
            os.symlink(victim, f".tokenfeed.manifest.{k:08x}.tmp", dir_fd=dfd)
        for k in range(2, 10):  # and the final names too
            os.symlink(victim, f"shard-{run}-{k:05d}.tfs", dir_fd=dfd)

    as_attacker(out, plant)
    err = None
    try:
        for d in docs[2:]:
            w.add_document(d)
        w.close()
    except OSError as e:
        err = e
    with open(victim, "rb") as f:
        check(f.read() == b"the victim's checkpoint", "the victim's file was overwritten through a planted link")
    who = "nobody" if os.geteuid() == 0 else "this user"
    if err is not None:
        return f"links planted as {who}; victim untouched; writer refused: {str(err)[:80]}"
    got = tokenfeed.open(out)
    check(got.num_documents == len(docs), "the dataset is incomplete")
    return f"20 links planted as {who} (temporary and final names); victim untouched, dataset complete"


def a6_overwrite_planted_manifest(tmp: str) -> str:
    import numpy as np
    import tokenfeed
    from pathlib import Path
    from test_security import as_attacker, plant_manifest_through_links, precious, shared_dir
    out = shared_dir(os.path.join(tmp, "team", "ds"))
    victim = precious(Path(tmp))
    with tokenfeed.DatasetWriter(out, vocab_size=1000) as w:
        w.add_document(np.arange(10))

    as_attacker(out, lambda dfd: plant_manifest_through_links(dfd, victim))
    try:
        with tokenfeed.DatasetWriter(out, vocab_size=1000, overwrite=True) as w:
            w.add_document(np.arange(20))
    except OSError as e:
        check(os.path.exists(victim), "the victim's file was deleted")
        return f"victim kept; overwrite refused: {str(e)[:80]}"
    check(os.path.exists(victim), "overwrite=True deleted lnk/precious.ckpt through the symlinked directory")
    check(os.path.islink(os.path.join(out, "direct.ckpt")), "the symlink named as a shard was deleted")
    return "lnk/precious.ckpt and direct.ckpt survive overwrite=True; new dataset written"


def a7_cache_swap(tmp: str) -> str:
    import numpy as np
    import tokenfeed
    from pathlib import Path
    from remote_util import MotoServer
    from test_security import _remote_dataset, as_attacker, forge_cache, shared_dir, swap_in_cache
    m = MotoServer()
    m.create_bucket("attack")
    local, url = _remote_dataset(m, "attack", Path(tmp), n_tokens=3_000_000)
    parent = shared_dir(os.path.join(tmp, "team"))
    cache = os.path.join(parent, "cache")
    opts = dict(cache_dir=cache, endpoint_url=m.endpoint, chunk_size=64 << 10)
    remote = tokenfeed.open(url, **opts)
    n = remote.num_tokens
    check(np.array_equal(remote.tokens(0, n), local.tokens(0, n)), "a first read differs")
    forged = forge_cache(cache)
    as_attacker(parent, lambda dfd: swap_in_cache(dfd, forged))
    seen = []
    for name, reader in (("running job", remote), ("reopen", tokenfeed.open(url, **opts))):
        try:
            got = reader.tokens(0, n)
        except PermissionError as e:
            check("replaced" in str(e), f"{name}: PermissionError of another kind: {e}")
            seen.append(f"{name}: PermissionError (cache replaced)")
        else:
            check(not np.any(got == 7) or np.array_equal(got, local.tokens(0, n)),
                  f"{name}: forged chunks were served")
            check(np.array_equal(got, local.tokens(0, n)), f"{name}: wrong bytes served")
            seen.append(f"{name}: true bytes")
    return f"{len(forged)} forged chunks planted as {'nobody' if os.geteuid() == 0 else 'this user'}; " + "; ".join(seen)


def a8_no_etag_rewrite(tmp: str) -> str:
    import numpy as np
    import tokenfeed
    from remote_util import write_dataset
    from test_remote_hangs import _VersionServer
    src = write_dataset(os.path.join(tmp, "src"), 200)
    shard = sorted(f for f in os.listdir(src) if f.endswith(".tfs"))[0]
    path = os.path.join(src, shard)
    srv = _VersionServer(src, "none")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ds = tokenfeed.open(f"{srv.url}/{shard}", cache_dir=os.path.join(tmp, "cache"), cache_limit="64MB",
                            chunk_size=64 << 10, max_attempts=2)
    said = [str(x.message) for x in w if "cannot be detected" in str(x.message)]
    check(bool(said), "open of an object without ETag said nothing")
    before = tokenfeed.open(path).tokens(0, ds.num_tokens)
    # rewrite in place at the same size: the token bytes change, the header stays
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(size // 2)
        f.write(bytes(4096))
    try:
        got = ds.tokens(0, ds.num_tokens)
        same = np.array_equal(got, before)
        after = "read after the rewrite: " + ("the bytes of open" if same else "the new bytes (as warned)")
    except (OSError, tokenfeed.FormatError) as e:
        after = f"read after the rewrite refused: {type(e).__name__}: {str(e)[:60]}"
    srv.stop()
    return f"warning at open: \"{said[0][:70]}...\"; {after}"


def a9_full_cache_disk(tmp: str) -> str:
    import numpy as np
    import tokenfeed
    mnt = os.path.join(tmp, "small")
    os.makedirs(mnt)
    how = "20 MiB tmpfs"
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", mnt], capture_output=True).returncode != 0:
        raise Reproduced("inconclusive: cannot mount a small file system (run as root)")
    try:
        from remote_util import MotoServer
        m = MotoServer()
        m.create_bucket("attack")
        src = os.path.join(tmp, "src")
        rng = np.random.default_rng(2)
        with tokenfeed.DatasetWriter(src, vocab_size=50000) as w:
            for _ in range(15):
                w.add_documents([rng.integers(0, 50000, size=10000, dtype=np.uint16) for _ in range(100)])
        m.upload_dir("attack", "ds", src)
        cache = os.path.join(mnt, "cache")
        ds = tokenfeed.open("s3://attack/ds/", cache_dir=cache, cache_limit="1GB", endpoint_url=m.endpoint)
        loader = tokenfeed.Loader(ds, seq_len=2048, batch_size=8, seed=1, shuffle="full", epochs=1)
        batches = 0
        try:
            for _ in loader:
                batches += 1
        except OSError as e:
            check(e.errno == 28, f"{type(e).__name__} errno {e.errno}: {e}")
            check(cache in str(e) or mnt in str(e), f"ENOSPC without the directory: {e}")
            what = str(e).split(": ", 1)[-1][:60]
            return f"{how}, 30 MiB dataset, cache_limit=1GB: OSError(ENOSPC) at batch {batches + 1}: \"{what}...\""
        finally:
            loader.close()
        raise Reproduced(f"an epoch of {batches} batches ended without a word about the full cache disk")
    finally:
        import gc
        gc.collect()
        subprocess.run(["umount", "-l", mnt], capture_output=True)


def a10_weak_etags(tmp: str) -> str:
    import numpy as np
    import tokenfeed
    from remote_util import write_dataset
    from test_remote_hangs import _VersionServer
    src = write_dataset(os.path.join(tmp, "src"), 200)
    shard = sorted(f for f in os.listdir(src) if f.endswith(".tfs"))[0]
    local = tokenfeed.open(os.path.join(src, shard))
    srv = _VersionServer(src, "weak")
    ds = tokenfeed.open(f"{srv.url}/{shard}", cache_dir=os.path.join(tmp, "cache"), cache_limit="64MB",
                        chunk_size=64 << 10, max_attempts=2)
    n = ds.num_tokens
    check(np.array_equal(ds.tokens(0, n), local.tokens(0, n)), "weak-ETag object read wrong")
    check(srv.refused == 0, f"{srv.refused} requests got 412")
    srv.stop()
    return f"{n:,} tokens read through a strict If-Match server, 0 answers 412"


def a11_many_stores(tmp: str) -> str:
    import gc
    import tokenfeed
    m, url = moto_dataset(tmp)

    def sample() -> Tuple[int, int, float]:
        with open("/proc/self/status") as f:
            rss = next(int(x.split()[1]) for x in f if x.startswith("VmRSS")) / 1024
        return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd")), rss

    t0, f0, r0 = sample()
    for i in range(256):
        ds = tokenfeed.open(url, cache_dir=os.path.join(tmp, "cache"), cache_limit=64_000_000 + i,
                            endpoint_url=m.endpoint, chunk_size=64 << 10)
        ds.tokens(0, 10)
        del ds
        gc.collect()
    last = tokenfeed.open(url, cache_dir=os.path.join(tmp, "cache"), cache_limit=32_000_000,
                          endpoint_url=m.endpoint, chunk_size=64 << 10)  # the 257th
    last.tokens(0, 10)
    del last
    gc.collect()
    t1, f1, r1 = sample()
    check(t1 < t0 + 40, f"threads {t0} -> {t1}")
    check(f1 < f0 + 40, f"fds {f0} -> {f1}")
    check(r1 < r0 + 100, f"RSS {r0:.0f} -> {r1:.0f} MiB")
    return f"257 opens: threads {t0}->{t1}, fds {f0}->{f1}, RSS {r0:.0f}->{r1:.0f} MiB"


def a12_many_shards(tmp: str) -> str:
    import test_remote_hangs
    import numpy as np
    d = os.path.join(tmp, "many")
    os.makedirs(d)
    rng = np.random.default_rng(0)
    for i in range(5000):
        np.save(os.path.join(d, f"part-{i:05d}.npy"), rng.integers(0, 1000, size=40, dtype=np.uint16))
    proc = run_script(test_remote_hangs._FD_CHILD, [d])
    out, err = proc.communicate(timeout=50)
    check(proc.returncode == 0, f"exit {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}")
    seen = []
    for line in out.strip().split("\n"):
        backend, n, fds = line.split()
        check(int(n) > 0 and int(fds) < 512, f"{backend}: {n} batches, {fds} descriptors held")
        seen.append(f"{backend} {n} batches, {fds} fds held")
    return "5,000 .npy files, ulimit -n 1024: " + "; ".join(seen) + "; 300 more opens fine"


def a13_block_table(tmp: str) -> str:
    import numpy as np
    import struct
    import tokenfeed
    from remote_util import FaultProxy, MotoServer
    if not tokenfeed.build_info()["zstd"]["usable"]:
        raise Reproduced("inconclusive: this build has no zstd")
    d = os.path.join(tmp, "ds")
    rng = np.random.default_rng(3)
    with tokenfeed.DatasetWriter(d, vocab_size=50000, compression="zstd", block_tokens=256) as w:
        w.add_documents([rng.integers(0, 50000, size=30000) for _ in range(100)])
    shard = [f for f in os.listdir(d) if f.endswith(".tfs")][0]
    p = os.path.join(d, shard)
    with open(p, "rb") as f:
        data = bytearray(f.read())
    tokens_bytes, = struct.unpack_from("<Q", data, 56)
    blocks_offset, = struct.unpack_from("<Q", data, 80)
    struct.pack_into("<QQ", data, blocks_offset, 0, tokens_bytes)
    with open(p, "wb") as f:
        f.write(bytes(data))
    m = MotoServer()
    m.create_bucket("attack")
    m.upload_dir("attack", "ds", d)
    px = FaultProxy(m.port)
    ds = tokenfeed.open(f"s3://attack/ds/{shard}", cache_dir=os.path.join(tmp, "cache"), cache_limit="64MB",
                        endpoint_url=px.endpoint, chunk_size=64 << 10)
    px.reset_counts()
    try:
        ds.tokens(0, 5)
    except tokenfeed.FormatError as e:
        sent = px.bytes_sent
        check(sent < tokens_bytes // 2, f"FormatError, but after {sent:,} of {tokens_bytes:,} bytes were fetched")
        return f"FormatError \"{str(e)[:60]}...\" after {sent:,} bytes fetched (token section {tokens_bytes:,})"
    raise Reproduced("a 5-token read through a corrupt block-table entry returned without an error")


def a14_planted_catalog_fifo(tmp: str) -> str:
    import json
    import numpy as np
    import tokenfeed
    from test_security import as_attacker
    # the catalog's name beside the data follows from the glob and the options alone
    scratch = os.path.join(tmp, "scratch")
    os.makedirs(scratch)
    for i in range(2):
        np.save(os.path.join(scratch, f"part-{i:03d}.npy"), np.arange(10, dtype=np.uint16))
    old = time.time() - 60
    for n in os.listdir(scratch) + [""]:
        os.utime(os.path.join(scratch, n), (old, old))
    name = os.path.basename(tokenfeed.build_catalog(os.path.join(scratch, "*.npy")))
    os.environ["TOKENFEED_CATALOG_DIR"] = "off"  # (this attack's process only) the catalog beside the data answers
    seen = []
    for planted in ("fifo", "sparse"):
        d = os.path.join(tmp, f"shared-{planted}")  # a sticky directory every user may create files in
        os.makedirs(d)
        os.chmod(d, 0o1777)
        for i in range(20):
            np.save(os.path.join(d, f"part-{i:03d}.npy"), np.arange(1000, dtype=np.uint16) + i)

        def plant(dfd: int, planted: str = planted) -> None:
            if planted == "fifo":
                os.mkfifo(name, 0o644, dir_fd=dfd)
            else:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
                os.ftruncate(fd, 2 << 30)  # 2 GiB, no disk used
                os.close(fd)

        as_attacker(d, plant)
        old = time.time() - 60
        for n in os.listdir(d):
            os.utime(os.path.join(d, n), (old, old), follow_symlinks=False)
        os.utime(d, (old, old))
        proc = run_script("""
            import json, resource, sys, time, warnings
            import tokenfeed
            t0 = time.monotonic()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                ds = tokenfeed.open(sys.argv[1])
            print(json.dumps({"files": ds.num_files, "s": time.monotonic() - t0,
                              "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                              "warn": [str(x.message) for x in w]}))
            """, [os.path.join(d, "*.npy")], start_new_session=True)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise Reproduced(f"open('dir/*.npy') blocked for 20 s on a {planted} planted as {name}")
        check(proc.returncode == 0, f"{planted}: exit {proc.returncode}: {err.strip().splitlines()[-1:]}")
        got = json.loads(out.strip().splitlines()[-1])
        check(got["files"] == 20, f"{planted}: {got['files']} files opened, not 20")
        check(got["rss_mb"] < 1024, f"{planted}: {got['rss_mb']} MB resident: the planted file was read")
        said = [w for w in got["warn"] if name in w]
        seen.append(f"{planted}: opened in {got['s']:.2f} s, {got['rss_mb']} MB RSS, "
                    f"{'warned: ' + said[0].split(': not used: ')[-1][:40] if said else 'no warning'}")
    return "; ".join(seen)


def a15_catalog_under_umask_002(tmp: str) -> str:
    import json
    import numpy as np
    d = os.path.join(tmp, "set")
    os.makedirs(d)
    for i in range(2000):
        np.save(os.path.join(d, f"part-{i:05d}.npy"), np.arange(20, dtype=np.uint16) + i)
    old = time.time() - 60
    for n in os.listdir(d):
        os.utime(os.path.join(d, n), (old, old))
    os.utime(d, (old, old))
    cat = os.path.join(tmp, "home", ".cache", "tokenfeed", "catalog")
    os.environ["TOKENFEED_CATALOG_DIR"] = cat  # (this attack's process only; a fresh directory)
    proc = run_script("""
        import json, os, sys, time
        os.umask(0o002)
        import tokenfeed
        # a test build (TOKENFEED_TEST_HOOKS=1) refuses to list a set while this is set:
        # the second open works only from the node's catalog
        times, listed = [], 1
        for i in range(2):
            if i:
                os.environ["TOKENFEED_FAULT_NO_LISTING"] = "1"
            t0 = time.monotonic()
            try:
                ds = tokenfeed.open(sys.argv[1])
            except Exception:
                listed += 1
            times.append(time.monotonic() - t0)
        cat = os.environ["TOKENFEED_CATALOG_DIR"]
        print(json.dumps({"listed": listed, "times": times, "mode": os.stat(cat).st_mode & 0o777}))
        """, [os.path.join(d, "*.npy")])
    out, err = proc.communicate(timeout=50)
    check(proc.returncode == 0, f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}")
    got = json.loads(out.strip().splitlines()[-1])
    check(got["mode"] & 0o022 == 0, f"the catalog directory was made {got['mode']:04o} under umask 002")
    check(got["listed"] == 1, f"the second open listed the set again ({got['listed']} listings in 2 opens): "
                              f"the catalog was not used ({got['times'][1]:.3f} s against {got['times'][0]:.3f} s)")
    return (f"catalog dir {got['mode']:04o} under umask 002; 2,000 files: first open {got['times'][0]:.3f} s, "
            f"second from the catalog {got['times'][1]:.3f} s, listed once")


def _state_attack_sources(tmp: str, k: int) -> List[object]:
    import numpy as np
    import tokenfeed
    out = []
    rng = np.random.default_rng(5)
    for i in range(k):
        d = os.path.join(tmp, f"src{i}")
        with tokenfeed.DatasetWriter(d, vocab_size=5000) as w:
            w.add_documents([rng.integers(0, 5000, size=int(rng.integers(20, 200))) for _ in range(300)])
        out.append(tokenfeed.open(d))
    return out


def a16_set_weights_many_calls(tmp: str) -> str:
    import json
    import tokenfeed
    srcs = _state_attack_sources(tmp, 3)
    ld = tokenfeed.Loader(srcs, weights=[0.5, 0.3, 0.2], seq_len=64, batch_size=8, seed=1, output="numpy")
    next(ld)
    ld.set_weights([0.4, 0.4, 0.2])
    one = len(json.dumps(ld.state_dict()))
    t0 = time.monotonic()
    for i in range(3000):  # an online-mixing controller re-weighting at one step, again and again
        ld.set_weights([0.1 + (i % 5) / 10, 0.4, 0.2])
    per_call = (time.monotonic() - t0) / 3000
    st = ld.state_dict()
    size = len(json.dumps(st))
    check(len(st["weights_history"]) == 1 and size <= one + 16,
          f"3,000 calls at one position: {len(st['weights_history'])} history entries, a {size:,}-byte state "
          f"(one call: {one:,} bytes)")
    for _ in range(500):  # then a change at every step
        next(ld)
        ld.set_weights([0.3, 0.3, 0.4])
    st = ld.state_dict()
    check(len(st["weights_history"]) == 501, f"500 changes at 500 steps: {len(st['weights_history'])} entries")
    resumed = tokenfeed.Loader(srcs, weights=[0.5, 0.3, 0.2], seq_len=64, batch_size=8, seed=1, output="numpy")
    resumed.load_state_dict(json.loads(json.dumps(st)))
    check(json.dumps(resumed.state_dict()) == json.dumps(st), "the resumed loader's state differs")
    return (f"3,000 calls at one position: 1 entry, {size:,}-byte state (one call: {one:,}), "
            f"{per_call * 1e3:.2f} ms per call; 500 changes at 500 steps: 501 entries, resumed exactly")


def a17_large_states(tmp: str) -> str:
    import json
    import tokenfeed
    srcs = _state_attack_sources(tmp, 1)
    ld = tokenfeed.Loader(srcs[0], seq_len=64, batch_size=8, seed=1, output="numpy")
    st = ld.state_dict()
    big = st | {"skipped": [[16 * i, 16 * i + 8] for i in range(100_000)]}
    text = json.dumps(big)
    t0 = time.monotonic()
    ld.load_state_dict(big)
    took = time.monotonic() - t0
    check(len(ld._order.skips()) == 100_000, f"{len(ld._order.skips())} skipped ranges after the load")
    t0 = time.monotonic()
    try:
        ld.load_state_dict(st | {f"unknown{i}": i for i in range(20_000)})
    except tokenfeed.StateError as e:
        refused = time.monotonic() - t0
        check("TF_STATE_MAX_MEMBERS" in str(e), f"20,000 unknown keys refused without naming the limit: {e}")
    else:
        raise Reproduced("20,000 unknown keys loaded: no bound on a state's members")
    try:
        ld.load_state_dict(st | {"skipped": [[16 * i, 16 * i + 8] for i in range((1 << 20) + 1)]})
    except tokenfeed.StateError as e:
        check("TF_STATE_MAX_SKIPS" in str(e), f"too many skipped ranges refused without naming the limit: {e}")
    else:
        raise Reproduced("2**20 + 1 skipped ranges loaded: no bound on a state's skipped ranges")
    return (f"100,000 skipped ranges ({len(text) / 1e6:.1f} MB) loaded in {took:.2f} s; 20,000 unknown keys "
            f"refused in {refused:.2f} s naming TF_STATE_MAX_MEMBERS; 2**20 + 1 ranges refused naming "
            f"TF_STATE_MAX_SKIPS")


def a18_renamed_over_shard(tmp: str) -> str:
    import numpy as np
    import tokenfeed
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    os.makedirs(a)
    os.makedirs(b)
    for i in range(6):
        np.save(os.path.join(a, f"s{i}.npy"), np.arange(1000, dtype=np.uint16) + 1000 * i)
        np.save(os.path.join(b, f"s{i}.npy"), np.arange(1000, dtype=np.uint16) + 9000 + i)
    seen = []
    for backend in ("pread", "io_uring"):
        for i in range(6):  # the set as written, again
            np.save(os.path.join(a, f"s{i}.npy"), np.arange(1000, dtype=np.uint16) + 1000 * i)
            np.save(os.path.join(b, f"s{i}.npy"), np.arange(1000, dtype=np.uint16) + 9000 + i)
        ds = tokenfeed.open(os.path.join(a, "*.npy"))
        loader = tokenfeed.Loader(ds, seq_len=99, batch_size=4, shuffle=False, output="numpy", backend=backend)
        os.rename(os.path.join(b, "s3.npy"), os.path.join(a, "s3.npy"))  # same size, another set's tokens
        try:
            for _ in range(15):
                x = next(loader)["tokens"]
                check(not (x >= 9000).any(), f"{backend}: served the renamed file's tokens {x[x >= 9000][:4].tolist()}")
            raise Reproduced(f"{backend}: no error after the shard was replaced")
        except tokenfeed.FormatError as e:
            check("s3.npy" in str(e) and "open the dataset again" in str(e), f"{backend}: {e}")
            seen.append(f"{backend} FormatError")
        finally:
            loader.close()
    return "same-size file renamed over shard 3: " + ", ".join(seen) + " naming it, no foreign token"


def a19_many_document_files(tmp: str) -> str:
    import resource
    import numpy as np
    import tokenfeed
    d = os.path.join(tmp, "docs")
    os.makedirs(d)
    rng = np.random.default_rng(0)
    for i in range(6000):
        np.save(os.path.join(d, f"doc-{i:05d}.npy"), rng.integers(1, 1000, size=int(rng.integers(20, 60)), dtype=np.uint16))
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    ds = tokenfeed.open(os.path.join(d, "*.npy"))
    base = len(os.listdir("/proc/self/fd"))
    ref, seen = None, []
    for backend in ("mmap", "pread", "io_uring"):
        with tokenfeed.Loader(ds, seq_len=8191, batch_size=16, num_threads=8, seed=1, backend=backend,
                              output="numpy") as loader:
            try:
                got = [next(loader)["tokens"].copy() for _ in range(4)]
            except OSError as e:
                raise Reproduced(f"{backend}: {type(e).__name__}: {str(e)[:120]}")
            fds = len(os.listdir("/proc/self/fd")) - base
        ref = got if ref is None else ref
        check(all(np.array_equal(x, y) for x, y in zip(ref, got)), f"{backend}: other tokens than mmap's")
        check(fds <= 1024 // 4 + 16, f"{backend}: {fds} descriptors open")
        seen.append(f"{backend} {fds} fds")
    return "6,000 files, ulimit -n 1024, 16 x 8192 x 8 threads: " + ", ".join(seen) + ", same batches"


def a20_resealed_set_catalog(tmp: str) -> str:
    import struct

    import numpy as np
    import obstore
    import tokenfeed
    import xxhash
    m, shards = moto_llmc_set(tmp, seed=14, count=20, name="shard_{:03d}.bin")
    url, prefix = "s3://attack/tokens/*.bin", "s3://attack/tokens/"
    kw = dict(cache_limit="64MB", endpoint_url=m.endpoint, chunk_size=64 << 10)
    seen = []
    # 1. entries from opening the llm.c objects as headerless uint16, stored under the name an open
    #    with dtype="uint16" looks for: names, sizes and ETags all match the listing
    raw = tokenfeed.open(url, cache_dir=os.path.join(tmp, "forger"), format="raw", dtype="uint16", **kw)
    forged = raw._core.remote_set_catalog(prefix, "*.bin", dtype="uint16", format=None)
    obstore.put(m.store("attack"), "tokens/" + tokenfeed._core.Dataset.set_catalog_name("*.bin", dtype="uint16",
                                                                                         format=None), forged)
    ds = tokenfeed.open(url, cache_dir=os.path.join(tmp, "victim1"), dtype="uint16", **kw)
    try:
        got = np.asarray(ds.tokens(0, 4))
        check(False, f"the llm.c header served as tokens: {got.tolist()} (num_tokens {ds.num_tokens:,})")
    except tokenfeed.FormatError as e:
        seen.append(f"raw entries: FormatError \"{str(e).split(': ', 1)[1][:70]}...\"")
    # 2. the honest catalog, one entry's token count set to 0 and the XXH64 seal computed again
    key = tokenfeed.build_catalog(url, endpoint_url=m.endpoint).split("s3://attack/", 1)[1]
    buf = bytearray(bytes(obstore.get(m.store("attack"), key).bytes())[:-8])
    at, (n,) = 40, struct.unpack_from("<Q", buf, 24)
    for i in range(n):
        _, rest = struct.unpack_from("<II", buf, at)
        at += 8 + rest
        aux, = struct.unpack_from("<I", buf, at)
        at += 4 + max(aux - 1, 0)
        if i == 7:
            struct.pack_into("<QQ", buf, at + 16, 0, 0)  # num_tokens, num_docs
        at += 144
    obstore.put(m.store("attack"), key, bytes(buf) + struct.pack("<Q", xxhash.xxh64_intdigest(bytes(buf), seed=0)))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ds = tokenfeed.open(url, cache_dir=os.path.join(tmp, "victim2"), **kw)
    want = sum(len(s) for s in shards)
    check(ds.num_tokens == want, f"an entry of 0 tokens took shard_007's 5,000 tokens out unseen: "
                                 f"num_tokens {ds.num_tokens:,}, the objects hold {want:,}")
    check(np.array_equal(np.asarray(ds.tokens(0, ds.num_tokens)), np.concatenate(shards)), "other tokens served")
    said = [str(x.message) for x in w if "holding no tokens" in str(x.message)]
    seen.append("0-token entry: catalog not used, " + (f"warned \"{said[0][said[0].index('(') + 1:][:60]}...\""
                                                        if said else "no warning") + f", {want:,} tokens read")
    return "; ".join(seen)


def a21_rewritten_object_two_nodes(tmp: str) -> str:
    import numpy as np
    import tokenfeed
    from conftest import write_llmc
    m, shards = moto_llmc_set(tmp, seed=15, count=4, name="s{}.bin")
    d = os.path.join(tmp, "tokens")
    kw = dict(cache_limit="64MB", endpoint_url=m.endpoint, chunk_size=64 << 10)
    seen = []
    for what, url in (("glob", "s3://attack/tokens/*.bin"), ("one object", "s3://attack/tokens/s2.bin")):
        a_dir, b_dir = os.path.join(tmp, f"nodeA-{len(seen)}"), os.path.join(tmp, f"nodeB-{len(seen)}")
        a = tokenfeed.open(url, cache_dir=a_dir, **kw)
        a.tokens(0, a.num_tokens)  # node A has every chunk in its cache
        old = shards[2] if what == "one object" else np.concatenate(shards)
        write_llmc(os.path.join(tmp, "new.bin"), shards[2][::-1].copy(), 1)
        with open(os.path.join(tmp, "new.bin"), "rb") as f:
            m.put("attack", "tokens/s2.bin", f.read())  # same size, a new ETag
        a2 = tokenfeed.open(url, cache_dir=a_dir, **kw)
        b = tokenfeed.open(url, cache_dir=b_dir, **kw)
        stale = np.array_equal(np.asarray(a2.tokens(0, a2.num_tokens)), old)
        check(a2.fingerprint == b.fingerprint and not stale,
              f"{what}: node A reopened {'the old bytes' if stale else 'other bytes'} under {a2.fingerprint}, a cold "
              f"node B reads the new version under {b.fingerprint}")
        seen.append(f"{what}: both nodes {b.fingerprint} (was {a.fingerprint})")
        with open(os.path.join(d, "s2.bin"), "rb") as f:
            m.put("attack", "tokens/s2.bin", f.read())  # back, for the next case
    return "node A's reopen read the new version: " + "; ".join(seen)


ATTACKS: List[Tuple[str, Callable[[str], str]]] = [
    ("next() against a store that stops answering", a1_next_stalled_store),
    ("exit without close() / Ctrl-C in the loop with requests in flight", a2_exit_without_close),
    ("Ctrl-C during a remote open and Dataset.tokens", a3_ctrl_c_remote_open),
    ("two tokenfeed convert runs into one output", a4_two_converts),
    ("symlinks planted at the writer's names", a5_planted_symlinks),
    ("overwrite=True with a planted manifest naming lnk/precious", a6_overwrite_planted_manifest),
    ("cache directory swapped under a running job, forged chunks", a7_cache_swap),
    ("http server without ETags, object rewritten in place", a8_no_etag_rewrite),
    ("full cache disk", a9_full_cache_disk),
    ("weak ETags, strict If-Match server", a10_weak_etags),
    ("256 opens with distinct remote options", a11_many_stores),
    ("5,000 shards under ulimit -n 1024", a12_many_shards),
    ("corrupt remote block-table entry", a13_block_table),
    ("FIFO or 2 GiB sparse file planted under a shard set's catalog name", a14_planted_catalog_fifo),
    ("node catalog created under umask 002", a15_catalog_under_umask_002),
    ("set_weights called 3,000 times at one step, then at every step", a16_set_weights_many_calls),
    ("a state of 100,000 skipped ranges, of 20,000 unknown keys", a17_large_states),
    ("a same-size file renamed over a shard, pread / io_uring", a18_renamed_over_shard),
    ("6,000 per-document files, pread / io_uring, ulimit -n 1024", a19_many_document_files),
    ("resealed set catalog: llm.c objects as raw uint16, a 0-token entry", a20_resealed_set_catalog),
    ("object rewritten in place, two nodes of one job", a21_rewritten_object_two_nodes),
]


def one(n: int) -> int:
    """The child: run attack n and print its verdict as the last line."""
    sys.path[:0] = [os.path.join(ROOT, "python"), *TEST_PATH]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from remote_util import TEST_CREDENTIALS
    os.environ.update(TEST_CREDENTIALS)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        os.environ.pop(k, None)
    _, fn = ATTACKS[n - 1]
    import faulthandler
    faulthandler.dump_traceback_later(LIMIT - 5, exit=False)  # where a hang waits, before the kill
    with tempfile.TemporaryDirectory(prefix=f"tf-attack-{n}-") as tmp:
        os.chmod(tmp, 0o755)  # the attacker (nobody) must reach the shared directories below
        try:
            seen = fn(tmp)
            print(f"VERDICT held {seen}", flush=True)
        except Reproduced as e:
            word = "INCONCLUSIVE" if str(e).startswith("inconclusive") else "REPRODUCED"
            print(f"VERDICT {word} {e}", flush=True)
        except BaseException as e:  # noqa: BLE001  (any other failure is a finding too)
            import traceback
            traceback.print_exc()
            print(f"VERDICT REPRODUCED unexpected {type(e).__name__}: {str(e)[:200]}", flush=True)
    os._exit(0)  # servers and stores of this attack end with the process


def main(argv: List[str]) -> int:
    if len(argv) == 2 and argv[0] == "--one":
        return one(int(argv[1]))
    which = [int(a) for a in argv] or list(range(1, len(ATTACKS) + 1))
    ok = True
    for n in which:
        name, _ = ATTACKS[n - 1]
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one", str(n)], env=dict(
            os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), *TEST_PATH])),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            verdict = f"REPRODUCED (hang: killed after {LIMIT:.0f} s)"
        else:
            last = [ln for ln in out.splitlines() if ln.startswith("VERDICT ")]
            if not last:
                tail = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
                verdict = f"REPRODUCED (no verdict: {tail[:200]})"
            else:
                _, word, what = last[-1].split(" ", 2)
                verdict = f"{word} ({what})"
        try:  # anything the attack left running in its group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        held = verdict.startswith("held")
        ok = ok and held
        print(f"{n} {name}: {verdict} [{time.monotonic() - t0:.0f} s]", flush=True)
        if not held and os.environ.get("ATTACK_VERBOSE"):
            print(err[-3000:], file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
