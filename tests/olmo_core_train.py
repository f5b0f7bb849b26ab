"""Train OLMo-core's own Trainer (a tiny Llama-like model on CPU) from tokenfeed's OLMo data
loader: DATA_DIR WORK_DIR OUT [switch]. Trains 6 steps in one run; then 3 steps in another,
which the Trainer's own checkpointer saves, and a third run that resumes from that checkpoint
to step 6. With `switch`, the first two runs read with OLMo's own NumpyFSLDataLoader and the
third continues OLMo's run on TokenfeedDataLoader(order="olmo"). Writes the input ids and
losses of each run to OUT (.npz). Used by tests/integrations/test_olmo_core.py in a fresh process, since
the Trainer needs a torch.distributed process group."""
import os
import sys

import numpy as np
import torch
from olmo_core.data.collator import DataCollator
from olmo_core.data.data_loader import NumpyFSLDataLoader
from olmo_core.data.numpy_dataset import NumpyFSLDataset
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig
from olmo_core.train import Duration, TrainerConfig
from olmo_core.train.callbacks import Callback, CheckpointerCallback
from olmo_core.train.train_module import TransformerTrainModuleConfig

from tokenfeed.integrations.olmo_core import TokenfeedDataLoader

SEQ, ROWS = 32, 4
SEEN: dict = {}


class Record(Callback):
    def pre_step(self, batch):
        SEEN["ids"].append(batch["input_ids"].numpy().copy())

    def log_metrics(self, step, metrics):
        if "train/CE loss" in metrics:
            SEEN["loss"].append(float(metrics["train/CE loss"]))


def make_loader(kind, files, folder):
    work = os.path.join(folder, "work")
    if kind == "tokenfeed":
        return TokenfeedDataLoader.from_paths(files, dtype="uint32", eos_token_id=0, sequence_length=SEQ,
                                              global_batch_size=ROWS * SEQ, work_dir=work, seed=7,
                                              loader_kwargs={"num_threads": 1})
    ds = NumpyFSLDataset(*files, sequence_length=SEQ, pad_token_id=1, eos_token_id=0, vocab_size=256,
                         dtype=np.uint32)
    ds.work_dir = work
    if kind == "olmo":  # OLMo's own loader
        return NumpyFSLDataLoader(ds, collator=DataCollator(pad_token_id=1), global_batch_size=ROWS * SEQ,
                                  work_dir=work, seed=7, num_threads=0)
    return TokenfeedDataLoader.from_olmo_dataset(ds, global_batch_size=ROWS * SEQ, work_dir=work, seed=7,
                                                 loader_kwargs={"num_threads": 1})


def train(data_dir, steps, folder, kind="tokenfeed"):
    SEEN.update(ids=[], loss=[])
    torch.manual_seed(0)
    model = TransformerConfig.llama_like(vocab_size=256, d_model=32, n_layers=1, n_heads=2).build(init_device="cpu")
    module = TransformerTrainModuleConfig(rank_microbatch_size=ROWS * SEQ, max_sequence_length=SEQ,
                                          optim=AdamWConfig(lr=1e-3)).build(model, device=torch.device("cpu"))
    files = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir) if f.endswith(".npy"))
    loader = make_loader(kind, files, folder)
    cfg = TrainerConfig(save_folder=folder, max_duration=Duration.steps(steps), metrics_collect_interval=1,
                        device="cpu", save_overwrite=True)
    cfg = cfg.with_callback("record", Record()).with_callback(
        "checkpointer", CheckpointerCallback(save_interval=3, save_async=False))
    cfg.build(module, loader).fit()
    return np.stack(SEEN["ids"]), np.array(SEEN["loss"])


def main(data_dir, work, out, switch=False):
    torch.distributed.init_process_group("gloo")
    kind = "olmo" if switch else "tokenfeed"
    full = train(data_dir, 6, os.path.join(work, "a"), kind)
    first = train(data_dir, 3, os.path.join(work, "b"), kind)
    # resumes from b's step-3 checkpoint (with switch: OLMo's loader's, on tokenfeed)
    rest = train(data_dir, 6, os.path.join(work, "b"), "tokenfeed-olmo" if switch else kind)
    np.savez(out, full_ids=full[0], full_loss=full[1], first_ids=first[0], first_loss=first[1],
             rest_ids=rest[0], rest_loss=rest[1])
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], switch=sys.argv[4:] == ["switch"])
