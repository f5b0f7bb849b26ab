"""A training process killed with SIGKILL resumes from its last checkpoint with
the same loss at every step as an uninterrupted run (order issue, reliability issue)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, kill_when_logged

torch = pytest.importorskip("torch")

EXAMPLE = os.path.join(ROOT, "docs", "examples", "train_tiny_gpt.py")
ARGS = ["--steps", "160", "--ckpt-every", "20", "--seq-len", "32", "--batch-size", "4"]


def run(out, data, extra=()):
    return subprocess.run([sys.executable, EXAMPLE, "--out", str(out), "--data", str(data), *ARGS, *extra],
                          capture_output=True, text=True, timeout=600)


def losses(out):
    with open(os.path.join(out, "losses.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_sigkill_and_resume_gives_identical_losses(tmp_path):
    data = tmp_path / "data"
    ref_dir, kill_dir = tmp_path / "ref", tmp_path / "killed"
    r = run(ref_dir, data)
    assert r.returncode == 0, r.stderr
    ref = {e["step"]: e["loss"] for e in losses(ref_dir)}
    assert sorted(ref) == list(range(1, 161))

    # start, wait until past a checkpoint but not done, then SIGKILL
    p = subprocess.Popen([sys.executable, EXAMPLE, "--out", str(kill_dir), "--data", str(data), *ARGS],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kill_when_logged(p, kill_dir / "losses.jsonl", 70, "training")
    killed_steps = len(losses(kill_dir))
    assert 70 <= killed_steps < 160

    r = run(kill_dir, data)
    assert r.returncode == 0, r.stderr
    assert "resumed at step" in r.stdout
    got = losses(kill_dir)
    # every logged step, before and after the kill, matches the uninterrupted run
    for e in got:
        assert e["loss"] == ref[e["step"]], f"step {e['step']}: {e['loss']} != {ref[e['step']]}"
    assert {e["step"] for e in got} == set(ref)
