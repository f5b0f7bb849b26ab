"""Steps that let other data-processing engines write tokenfeed datasets.

Each integration lives in its own module and imports its engine only when that module
is imported, so ``import tokenfeed`` never needs them:

- :mod:`tokenfeed.integrations.datatrove` — a datatrove pipeline step
  (``pip install 'datatrove>=0.5' orjson 'tokenizers>=0.13'``); see docs/guides/cluster-conversion.md.
"""
