"""A next() that waits on stalled workers, ended by Ctrl-C or by close() from another
thread: the script and the check that the engine's tests (a CPU loader) and the device
tests (a loader with a device) share.

The workers are held for 60 s ($TOKENFEED_FAULT_DELAY_MS, a test build's hook); the
script must come back well before that, with the position unmoved, and its close() must
not wait for the stalled workers.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Dict, Optional

SCRIPT = textwrap.dedent("""
    import signal, sys, threading, time, tokenfeed
    # Ctrl-C raises KeyboardInterrupt even when the test run was started with SIGINT
    # ignored (a background job of a non-interactive shell), which children inherit
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ds = tokenfeed.open(sys.argv[1])
    mode, device = sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None
    l = tokenfeed.Loader(ds, seq_len=64, batch_size=4, num_threads=2, output="numpy", device=device)
    if mode == "close":
        threading.Timer(0.5, l.close).start()
    print("waiting", flush=True)
    t0 = time.monotonic()
    try:
        next(l)                      # workers stall for 60 s ($TOKENFEED_FAULT_DELAY_MS)
        print("got a batch", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    except ValueError as e:
        print("closed:", e, flush=True)
    assert l.position == 0
    l.close()                        # must not wait for the stalled workers
    print(f"done {time.monotonic() - t0:.1f}", flush=True)
""")


def run_stalled(tmp_path: "os.PathLike[str]", dataset: str, mode: str, env: Dict[str, str],
                device: Optional[str] = None) -> None:
    """Run the script on `dataset` ("sigint": Ctrl-C after 0.5 s; "close": close() from a
    timer thread) with `env` added to a copy of this process's environment (less any
    CUDA double settings), and check that next() ended as it should, within 40 s."""
    script = os.path.join(os.fspath(tmp_path), "stalled.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    e = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_DOUBLE")}
    e.update(env, TOKENFEED_FAULT_DELAY_MS="60000")
    p = subprocess.Popen([sys.executable, script, dataset, mode] + ([device] if device else []),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    assert p.stdout is not None and p.stdout.readline().strip() == "waiting"
    if mode == "sigint":
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=45)
    assert p.returncode == 0, out + err
    lines = out.split("\n")
    closed = "closed: the loader was closed while waiting for a batch"
    assert lines[0] == ("interrupted" if mode == "sigint" else closed)
    assert lines[1].startswith("done")
    assert float(lines[1].split()[1]) < 40
