"""A torchtitan config registry whose runs read their data with tokenfeed.

    torchrun --nproc_per_node=8 -m torchtitan.train \
        --module torchtitan_tokenfeed --config llama3_debugmodel_tokenfeed \
        --dataloader.dataset_path data/train --hf_assets_path assets/tokenizer

(with this file's folder on PYTHONPATH). Every other option is torchtitan's own and can be
set on the command line the same way (``--training.seq_len 4096``,
``--checkpoint.interval 100``, ``--dataloader.seed 7``); the data loader's state is saved
and restored by torchtitan's checkpoint like the rest of the run.
"""
from torchtitan.components.validate import Validator
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

from tokenfeed.integrations.torchtitan import TokenfeedDataLoader


def llama3_debugmodel_tokenfeed() -> Trainer.Config:
    config = llama3_debugmodel()
    config.dataloader = TokenfeedDataLoader.Config(
        dataset_path="data/train",  # a tokenfeed dataset (or shard files, comma-separated)
        seed=0,
        packing="best_fit",  # whole documents where they fit: fewer split across rows
        loader={"separator_id": None},  # any other tokenfeed.Loader keyword
    )
    config.training.seq_len = 2048
    config.training.local_batch_size = 8
    config.training.steps = 100
    config.checkpoint.enable = True
    config.checkpoint.interval = 50
    config.validator = Validator.Config(enable=False)  # llama3_debugmodel's validator reads c4 from the Hub
    return config
