"""tokenfeed inside other frameworks: engines that write datasets, trainers that read them.

Each integration lives in its own module and imports its engine only when that module
is imported, so ``import tokenfeed`` never needs them:

- :mod:`tokenfeed.integrations.datatrove` — a datatrove pipeline step
  (``pip install 'datatrove>=0.5' orjson 'tokenizers>=0.13'``); see docs/guides/cluster-conversion.md.
- :mod:`tokenfeed.integrations.torchtitan` — a torchtitan data loader and its Config
  (``pip install torchtitan``); see docs/guides/torchtitan.md.
- :mod:`tokenfeed.integrations.megatron` — a datasets provider for Megatron-LM's
  ``pretrain`` (``pip install megatron-core``); see docs/guides/megatron.md.
- :mod:`tokenfeed.integrations.olmo_core` — a data loader for OLMo-core's ``Trainer``
  (``pip install ai2-olmo-core``); see docs/guides/olmo-core.md.
- :mod:`tokenfeed.integrations.hf` — a Hugging Face ``Trainer`` fed by a Loader; see
  docs/guides/hf-trainer.md.
- :mod:`tokenfeed.integrations.lightning` — a ``LightningDataModule``; see
  docs/guides/lightning.md.
- :mod:`tokenfeed.integrations.jax` — global ``jax.Array`` batches over a mesh of hosts,
  state kept by Orbax; see docs/guides/jax-cupy.md.
"""
