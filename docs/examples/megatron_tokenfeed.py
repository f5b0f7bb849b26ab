"""Megatron-LM's GPT pretraining with its data read by tokenfeed.

Put this file beside Megatron-LM's pretrain_gpt.py and run it as you run that script,
with the same arguments: the data options (--data-path with its weights, or
--train-data-path / --valid-data-path / --test-data-path; --split, --seq-length, --seed,
--reset-position-ids, --reset-attention-mask, --eod-mask-loss,
--create-attention-mask-in-dataloader) mean what they mean there; a prefix is a Megatron
.bin/.idx prefix (read in place) or a tokenfeed dataset.

    torchrun --nproc_per_node=8 megatron_tokenfeed.py <pretrain_gpt.py's arguments> \
        --train-data-path 0.7 data/web 0.3 data/code --valid-data-path data/valid
"""
from functools import partial

from megatron.core.enums import ModelType
from megatron.training import get_args, pretrain

import pretrain_gpt  # Megatron-LM's script: its model provider, forward step and dataset config
from tokenfeed.integrations.megatron import datasets_provider

if __name__ == "__main__":
    provider = datasets_provider(lambda: pretrain_gpt.core_gpt_dataset_config_from_args(get_args()))
    pretrain(provider, partial(pretrain_gpt.model_provider, pretrain_gpt.gpt_builder), ModelType.encoder_or_decoder,
             pretrain_gpt.forward_step, args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
