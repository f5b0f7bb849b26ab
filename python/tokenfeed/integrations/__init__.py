"""tokenfeed inside other frameworks: engines that write datasets, trainers that read them.

Each integration lives in its own module and imports its engine only when that module
is imported, so ``import tokenfeed`` never needs them:

- :mod:`tokenfeed.integrations.datatrove` — a datatrove pipeline step
  (``pip install 'datatrove>=0.5' orjson 'tokenizers>=0.13'``); see docs/guides/cluster-conversion.md.
- :mod:`tokenfeed.integrations.torchtitan` — a torchtitan data loader and its Config
  (``pip install torchtitan``); see docs/guides/torchtitan.md.
- :mod:`tokenfeed.integrations.megatron` — a datasets provider for Megatron-LM's
  ``pretrain`` (``pip install megatron-core``); see docs/guides/megatron.md.
"""
