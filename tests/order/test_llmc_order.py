"""order="llmc": a run begun on llm.c's data loader continues on tokenfeed's Loader.

The reference is llm.c's own DataLoader (tests/c/llmc_dataloader.h, a port of
llmc/dataloader.h) compiled into a small driver (tests/c/llmc_ref.c) that writes the
batches each llm.c process reads. For one and two processes, with shuffling on
(train_gpt2's permute_train_loader, seed 42) and off, over shards of unequal sizes, three
epochs of every rank's batches equal llm.c's, across shard and epoch ends; a state saved
mid-epoch resumes exactly; one process can replay several llm.c processes' batches
(llmc_processes), and a state refuses another number of processes."""
from __future__ import annotations

import dataclasses

import os
import shutil
import subprocess
from pathlib import Path
from typing import List

import numpy as np
import pytest

import tokenfeed

HERE = Path(__file__).parent.parent  # tests/
SIZES = (300, 1031, 517, 777)  # unequal: shuffled processes cross shard ends at different steps


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed (the build needs one too)"
    lib = tokenfeed.get_library()
    libdir = os.path.dirname(lib)
    exe = str(tmp_path_factory.mktemp("llmc_ref") / "llmc_ref")
    cmd = [cc, "-O1", "-Wall", "-Wextra", "-Werror", "-std=c11", "-D_GNU_SOURCE", "-I", tokenfeed.get_include(),
           "-I", str(HERE / "c"), str(HERE / "c" / "llmc_ref.c"), "-L", libdir, "-ltokenfeed",
           f"-Wl,-rpath,{libdir}", "-o", exe]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, " ".join(cmd) + "\n" + p.stderr
    return exe


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> List[str]:
    d = tmp_path_factory.mktemp("llmc_shards")
    rng = np.random.default_rng(1)
    out = []
    for f, n in enumerate(SIZES):
        header = np.zeros(256, dtype=np.int32)
        header[:3] = (20240520, 1, n)
        p = d / f"shard_{f:02d}.bin"
        with open(p, "wb") as fh:
            fh.write(header.tobytes())
            fh.write(rng.integers(0, 50257, size=n).astype(np.uint16).tobytes())
        out.append(str(p))
    return out


def steps_per_epoch(R: int, B: int, T: int) -> int:
    return sum((n - 1) // (R * B * T) for n in SIZES)


def llmc_batches(ref: str, shards: List[str], tmp: Path, R: int, r: int, B: int, T: int, shuffle: bool,
                 steps: int) -> np.ndarray:
    """llm.c process r's batches: steps x B rows of T + 1 tokens (its overlapping windows)."""
    out = tmp / f"ref_{R}_{r}_{B}_{T}_{int(shuffle)}.bin"
    p = subprocess.run([ref, str(B), str(T), str(R), str(r), str(int(shuffle)), "42", str(steps), str(out),
                        *shards], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    buf = np.fromfile(out, dtype=np.uint16).reshape(steps, B * T + 1)
    idx = np.arange(B)[:, None] * T + np.arange(T + 1)[None, :]
    return buf[:, idx]


def loader(shards: List[str], R: int, r: int, B: int, T: int, shuffle: bool, **kw) -> tokenfeed.Loader:
    # llm.c's seed, 42, is the default of order="llmc"
    return tokenfeed.Loader(shards, seq_len=T, batch_size=B, dp_rank=r, dp_size=R, order="llmc",
                            shuffle=shuffle, dtype="uint16", output="numpy", **kw)


CASES = [(1, 4, 8, False), (1, 3, 10, True), (2, 2, 16, True), (2, 2, 16, False)]


@pytest.mark.parametrize("R,B,T,shuffle", CASES)
def test_batches_identical_to_llmc(ref, shards, tmp_path, R, B, T, shuffle):
    E = steps_per_epoch(R, B, T)
    for r in range(R):
        want = llmc_batches(ref, shards, tmp_path, R, r, B, T, shuffle, 3 * E)
        ld = loader(shards, R, r, B, T, shuffle)
        assert ld.num_samples == E * R * B
        got = np.stack([next(ld)["tokens"] for _ in range(3 * E)])
        assert np.array_equal(got, want), f"process {r}: first differing step " \
            f"{int(np.argmax((got != want).reshape(3 * E, -1).any(axis=1)))}"


@pytest.mark.parametrize("R,B,T,shuffle", [(1, 3, 10, True), (2, 2, 16, True), (2, 2, 16, False)])
def test_resume_exact(ref, shards, tmp_path, R, B, T, shuffle):
    E = steps_per_epoch(R, B, T)
    for r in range(R):
        want = llmc_batches(ref, shards, tmp_path, R, r, B, T, shuffle, 2 * E)
        for k in (SIZES[0] // (R * B * T) + 1, E + 3):  # past the first shard's end; in the second epoch
            first = loader(shards, R, r, B, T, shuffle)
            for _ in range(k):
                next(first)
            st = first.state_dict()
            assert st["config"]["order"] == "llmc" and st["config"]["llmc_processes"] == R
            again = loader(shards, R, r, B, T, shuffle)
            again.load_state_dict(st)
            got = np.stack([next(again)["tokens"] for _ in range(2 * E - k)])
            assert np.array_equal(got, want[k:])


def test_processes_replayed_and_refused(ref, shards, tmp_path):
    R, B, T = 2, 2, 16
    E = steps_per_epoch(R, B, T)
    both = [llmc_batches(ref, shards, tmp_path, R, r, B, T, True, E) for r in range(R)]
    # one process reading both llm.c processes' rows: the global batch, process 0's rows first
    one = tokenfeed.Loader(shards, seq_len=T, batch_size=R * B, dp_rank=0, dp_size=1, order="llmc", llmc_processes=R,
                           seed=42, dtype="uint16", output="numpy")
    got = np.stack([next(one)["tokens"] for _ in range(E)])
    assert np.array_equal(got, np.concatenate(both, axis=1))
    # shuffled processes read different shards: a state resumes only with as many
    st = loader(shards, R, 0, B, T, True).state_dict()
    with pytest.raises(tokenfeed.StateError, match="llmc_processes"):
        tokenfeed.Loader(shards, seq_len=T, batch_size=R * B, dp_rank=0, dp_size=1, order="llmc", seed=42,
                         dtype="uint16").load_state_dict(st)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        loader(shards, 1, 0, 40, 8, True)  # 40 x 8 tokens: more than the 300-token shard holds


def test_llmc_processes_zero_is_the_data_parallel_size(ref, shards, tmp_path):
    """llmc_processes=0 means what None means, the data-parallel size: in Python as in C
    (tf_loader_create takes it from world_size; tests/c/test_order.c), never one process."""
    R, B, T = 2, 2, 16
    E = steps_per_epoch(R, B, T)
    want = llmc_batches(ref, shards, tmp_path, R, 0, B, T, True, E)
    zero = loader(shards, R, 0, B, T, True, llmc_processes=0)
    st = zero.state_dict()
    assert st["config"]["llmc_processes"] == R
    assert st == loader(shards, R, 0, B, T, True).state_dict() == loader(shards, R, 0, B, T, True,
                                                                       llmc_processes=R).state_dict()
    assert np.array_equal(np.stack([next(zero)["tokens"] for _ in range(E)]), want)
    # its state resumes a loader that reads the same stream with llmc_processes given
    again = loader(shards, R, 0, B, T, True, llmc_processes=R)
    again.load_state_dict(zero.state_dict())
    # the C order on its own does not know the data-parallel size: refused, saying so
    with pytest.raises(ValueError, match="llmc_processes"):
        dataclasses.replace(zero._order_cfg, llmc_processes=0).build(zero._core_source())
