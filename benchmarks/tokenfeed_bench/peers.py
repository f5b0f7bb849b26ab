"""The peer loaders the benchmark runs beside tokenfeed, with the pip requirements that
install each one into its own virtual environment.

Versions are pinned so that an install resolves in seconds and a rerun measures the
same code; torch is added at run time, pinned to the benchmark interpreter's own
version (never a fresh, unpinned download). Raise a pin here after checking that the
new release installs and runs (``tokenfeed bench --only peers --install-peers``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class Peer:
    key: str                       # --peers name and venv directory name
    name: str                      # row name in tables
    requirements: Tuple[str, ...]  # pip requirements, torch added at run time
    imports: str                   # module that must import for the peer to count as installed
    loader: str                    # tokenfeed_bench.loaders.<loader> runs it
    needs_torch: bool = True
    resumable: bool = False        # has its own resumable state that the restore group measures
    shards: bool = False           # its on-disk format has a shard count the start-up group varies


PEERS: Tuple[Peer, ...] = (
    Peer("litdata", "LitData TokensLoader", ("litdata==0.2.76",), "litdata", "litdata_peer",
         resumable=True, shards=True),
    # 0.17 and later need Python 3.12
    Peer("megatron-core", "Megatron-core GPTDataset",
         ('megatron-core==0.16.1; python_version < "3.12"', 'megatron-core==0.19.2; python_version >= "3.12"'),
         "megatron.core.datasets.gpt_dataset", "megatron_peer"),
    Peer("datasets", "HF datasets (Arrow)", ("datasets==5.2.0",), "datasets", "hf_datasets_peer", shards=True),
    Peer("grain", "Grain DataLoader", ("grain==0.2.18",), "grain", "grain_peer", needs_torch=False,
         resumable=True),
    Peer("torchdata", "torchdata StatefulDataLoader", ("torchdata==0.11.0",), "torchdata.stateful_dataloader",
         "torchdata_peer", resumable=True),
    Peer("mosaicml-streaming", "MosaicML Streaming (MDS)", ("mosaicml-streaming==0.13.0",), "streaming",
         "mosaic_peer", resumable=True, shards=True),
)

BY_KEY: Dict[str, Peer] = {p.key: p for p in PEERS}
