"""tokenfeed.integrations.jax: global jax.Arrays over a mesh of several JAX processes (CPU,
jax.distributed on 127.0.0.1), the state kept by Orbax, a resumed run continuing exactly."""
import os
import socket
import subprocess
import sys

import numpy as np

import jax  # noqa: E402,F401  (the workers use it; the test extra installs it)
import orbax.checkpoint  # noqa: E402,F401

import tokenfeed  # noqa: E402
from conftest import write_eos_documents  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helper scripts are
NPROC, G, L = 2, 8, 32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(data, ckpt, out, steps):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(tokenfeed.__path__[0]), env.get("PYTHONPATH")] if p)
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "jax_worker.py"), str(i), str(NPROC), str(port),
                               data, ckpt, f"{out}-{i}.npz", str(steps)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(NPROC)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=180)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    return [np.load(f"{out}-{i}.npz") for i in range(NPROC)]


def test_global_arrays_and_orbax_resume(tmp_path):
    data = write_eos_documents(tmp_path / "train.bin")
    ref_loader = tokenfeed.Loader(tokenfeed.open(data, dtype="uint16", eos_id=0), seq_len=L, batch_size=G, seed=3,
                                  output="numpy")
    ref = [np.asarray(next(ref_loader)["input_ids"]).copy() for _ in range(6)]

    full = launch(data, str(tmp_path / "ckpt-a"), str(tmp_path / "full"), 6)
    for i, r in enumerate(full):
        assert [tuple(s) for s in r["shapes"]] == [(G, L)] * 6  # one global array per step
        for step in range(6):  # process i holds its contiguous share of tokenfeed's global batch
            assert np.array_equal(r["rows"][step], ref[step][i * G // NPROC:(i + 1) * G // NPROC])

    first = launch(data, str(tmp_path / "ckpt-b"), str(tmp_path / "first"), 3)
    rest = launch(data, str(tmp_path / "ckpt-b"), str(tmp_path / "rest"), 6)  # restores Orbax's step 3
    for i in range(NPROC):
        assert int(first[i]["start"]) == 0 and int(rest[i]["start"]) == 3
        assert np.array_equal(np.concatenate([first[i]["rows"], rest[i]["rows"]]), full[i]["rows"])
