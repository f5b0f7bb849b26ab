"""Several Python threads calling into tokenfeed at once, for a ThreadSanitizer build of the
extension (run by .ci/tsan_threads.sh): each thread with its own Loader over one shared
Dataset (two engine threads each, full shuffle, state_dict), threads sharing one Loader (the binding refuses a
Loader used from another thread while one is inside it), and threads reading the shared
Dataset's tokens. Prints what happened; TSan reports races on its own (halt_on_error)."""
from __future__ import annotations

import os
import sys
import tempfile
import threading

import numpy as np

import tokenfeed

print("extension:", tokenfeed._core.__file__)
d = tempfile.mkdtemp(prefix="tokenfeed-tsan-")
rng = np.random.default_rng(0)
with tokenfeed.DatasetWriter(os.path.join(d, "ds"), vocab_size=50257, shard_tokens=20_000) as w:
    for _ in range(300):
        w.add_document(rng.integers(0, 50257, size=int(rng.integers(1, 400))))
ds = tokenfeed.open(os.path.join(d, "ds"))
refused: list[str] = []
failed: list[BaseException] = []


def guard(fn):
    def run(*a):
        try:
            fn(*a)
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)
    return run


@guard
def own_loader(seed: int) -> None:
    with tokenfeed.Loader(ds, seq_len=64, batch_size=4, seed=seed, shuffle="full", output="numpy",
                          num_threads=2) as loader:
        for _ in range(100):
            next(loader)
        loader.state_dict()


@guard
def shared_loader(loader) -> None:
    for _ in range(100):
        try:
            next(loader)
        except RuntimeError as e:
            if "another thread" not in str(e):
                raise
            refused.append(str(e))


@guard
def reads() -> None:
    for i in range(200):
        ds.tokens(i * 10, i * 10 + 50)


shared = tokenfeed.Loader(ds, seq_len=64, batch_size=4, output="numpy")
ts = [threading.Thread(target=own_loader, args=(s,)) for s in range(3)]
ts += [threading.Thread(target=shared_loader, args=(shared,)) for _ in range(3)]
ts += [threading.Thread(target=reads) for _ in range(2)]
for t in ts:
    t.start()
for t in ts:
    t.join()
shared.close()
print(f"{len(ts)} threads done; next() on the shared loader refused {len(refused)} times (another thread in it)")
if failed:
    print("failed:", failed)
    sys.exit(1)
