"""Train OLMo-core's Trainer from tokenfeed on OLMo's token files (a tiny model, on CPU).

    python docs/examples/olmo_core_train.py DATA_DIR SAVE_FOLDER [STEPS]

DATA_DIR holds OLMo's headerless uint32 token files (``*.npy``, written by dolma, an
end-of-document id after every document; ``--make-data`` writes a small synthetic set).
Run it twice with the same SAVE_FOLDER and a larger STEPS: the second run resumes from the
Trainer's checkpoint with the exact batches it would have seen. Runs on one process;
launch it with torchrun for several.
"""
import argparse
import glob
import os

import numpy as np
import torch
from olmo_core.distributed.utils import get_rank, get_world_size
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig
from olmo_core.train import Duration, TrainerConfig
from olmo_core.train.callbacks import CheckpointerCallback
from olmo_core.train.train_module import TransformerTrainModuleConfig

from tokenfeed.integrations.olmo_core import TokenfeedDataLoader

EOS, VOCAB, SEQ, ROWS = 0, 256, 64, 8


def make_data(d: str) -> None:
    rng = np.random.default_rng(0)
    os.makedirs(d, exist_ok=True)
    for f in range(2):
        docs = [np.append(rng.integers(1, VOCAB, size=int(rng.integers(8, 200))), EOS) for _ in range(300)]
        np.concatenate(docs).astype(np.uint32).tofile(os.path.join(d, f"part-{f}-00000.npy"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir")
    ap.add_argument("save_folder")
    ap.add_argument("steps", type=int, nargs="?", default=20)
    ap.add_argument("--make-data", action="store_true")
    a = ap.parse_args()
    if a.make_data:
        make_data(a.data_dir)
    for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", RANK="0", WORLD_SIZE="1",
                     LOCAL_RANK="0", LOCAL_WORLD_SIZE="1").items():
        os.environ.setdefault(k, v)
    torch.distributed.init_process_group("gloo")

    torch.manual_seed(0)
    model = TransformerConfig.llama_like(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4).build(init_device="cpu")
    train_module = TransformerTrainModuleConfig(
        rank_microbatch_size=ROWS * SEQ, max_sequence_length=SEQ, optim=AdamWConfig(lr=1e-3),
    ).build(model, device=torch.device("cpu"))
    data_loader = TokenfeedDataLoader.from_paths(
        sorted(glob.glob(os.path.join(a.data_dir, "*.npy"))), dtype="uint32", eos_token_id=EOS,
        sequence_length=SEQ, global_batch_size=ROWS * SEQ * get_world_size(),   # tokens
        work_dir=os.path.join(a.save_folder, "work"), dp_world_size=get_world_size(), dp_rank=get_rank(),
        seed=1234)
    trainer = (TrainerConfig(save_folder=a.save_folder, max_duration=Duration.steps(a.steps), device="cpu",
                             metrics_collect_interval=5, save_overwrite=True)
               .with_callback("checkpointer", CheckpointerCallback(save_interval=10, save_async=False))
               .build(train_module, data_loader))
    trainer.fit()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
