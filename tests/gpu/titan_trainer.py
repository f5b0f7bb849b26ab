"""torchtitan's whole Trainer fed by tokenfeed, stopped and resumed: the check the CPU suite
cannot make (torchtitan's Trainer needs a CUDA GPU). Needs torchtitan installed.

    python tests/gpu/titan_trainer.py WORKDIR [STEPS] [RESUME_AT]

1. writes a tokenizer (2,048 word-level tokens, the llama3 debug model's vocabulary: nothing
   is downloaded) and a tokenfeed dataset of random documents over that vocabulary;
2. runs `torchrun -m torchtitan.train` with docs/examples/torchtitan_tokenfeed.py's job
   config (the llama3 debug model, FlexAttention with document masks from the loader's
   positions, best-fit packing) for STEPS steps, a checkpoint every RESUME_AT steps;
3. copies only the step-RESUME_AT checkpoint into a fresh dump folder (a run killed after
   that checkpoint) and runs the Trainer again: it loads the checkpoint, the loader's state
   with it, and trains steps RESUME_AT+1..STEPS;
4. compares the loss of every resumed step with the uninterrupted run's (torchtitan's
   deterministic mode, so equal batches give equal losses) and writes WORKDIR/titan.json.

Exits 1 when a loss differs or a run fails.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 2048


def write_tokenizer(folder: str) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    os.makedirs(folder, exist_ok=True)
    vocab = {f"t{i}": i for i in range(VOCAB - 2)}
    vocab["<|begin_of_text|>"] = VOCAB - 2
    vocab["<|end_of_text|>"] = VOCAB - 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f)


def write_dataset(path: str) -> None:
    import tokenfeed

    rng = np.random.default_rng(0)
    with tokenfeed.DatasetWriter(path, vocab_size=VOCAB, overwrite=True) as w:
        for n in rng.geometric(1 / 600, size=4000):
            w.add_document(rng.integers(0, VOCAB - 2, size=int(n)))


def train(work: str, dump: str, steps: int, every: int, log: str) -> dict:
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONPATH=os.pathsep.join(
        p for p in [os.path.join(ROOT, "docs", "examples"), os.environ.get("PYTHONPATH", "")] if p))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           "-m", "torchtitan.train", "--module", "torchtitan_tokenfeed", "--config", "llama3_debugmodel_tokenfeed",
           "--dataloader.dataset_path", os.path.join(work, "data"), "--dataloader.seed", "7",
           "--hf_assets_path", os.path.join(work, "tokenizer"), "--dump_folder", dump,
           "--training.steps", str(steps), "--checkpoint.interval", str(every),
           "--metrics.log_freq", "1", "--debug.deterministic", "--debug.deterministic_warn_only", "--debug.seed", "0"]
    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=work, timeout=420)
    wall = time.time() - t0
    text = open(log, errors="replace").read()
    if r.returncode != 0:
        print(text[-6000:])
        raise SystemExit(f"the Trainer failed (exit {r.returncode}); log: {log}")
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    losses = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"step:\s*(\d+)\s+loss:\s*([-0-9.e+]+)", text)}
    return {"losses": losses, "wall_s": round(wall, 1)}


def main() -> int:
    work = os.path.abspath(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    every = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    os.makedirs(work, exist_ok=True)
    write_tokenizer(os.path.join(work, "tokenizer"))
    write_dataset(os.path.join(work, "data"))

    full = train(work, os.path.join(work, "full"), steps, every, os.path.join(work, "full.log"))
    ck = os.path.join(work, "full", "checkpoint", f"step-{every}")
    if not os.path.isdir(ck):
        raise SystemExit(f"no checkpoint at {ck}")
    resumed_dump = os.path.join(work, "resumed")
    shutil.rmtree(resumed_dump, ignore_errors=True)
    shutil.copytree(ck, os.path.join(resumed_dump, "checkpoint", f"step-{every}"))
    again = train(work, resumed_dump, steps, every, os.path.join(work, "resumed.log"))

    want = {s: l for s, l in full["losses"].items() if s > every}
    got = again["losses"]
    same = sorted(want) == sorted(got) and len(want) == steps - every and all(got[s] == want[s] for s in want)
    diff = max((abs(got[s] - want[s]) for s in want if s in got), default=float("nan"))
    out = {"steps": steps, "max_abs_loss_difference": diff, "resumed_at": every, "full": full, "resumed": again, "identical": same}
    with open(os.path.join(work, "titan.json"), "w") as f:
        json.dump(out, f, indent=1)
    for s in range(1, steps + 1):
        print(f"step {s:3d}  uninterrupted {full['losses'].get(s, float('nan')):.5f}"
              + (f"  resumed {got[s]:.5f}" if s in got else ""))
    print("largest difference:", diff)
    print("resumed losses identical to the uninterrupted run's:" , same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
