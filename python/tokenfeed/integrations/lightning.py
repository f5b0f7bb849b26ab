"""A Lightning ``LightningDataModule`` over a :class:`tokenfeed.Loader`.

::

    import lightning as L
    from tokenfeed.integrations.lightning import TokenfeedDataModule

    data = TokenfeedDataModule("data/train", seq_len=2048, batch_size=8, seed=0)
    trainer = L.Trainer(max_steps=10_000, accelerator="gpu", devices=8, strategy="ddp")
    trainer.fit(model, datamodule=data)       # resume: trainer.fit(model, datamodule=data, ckpt_path="last.ckpt")

The Loader is made in ``train_dataloader()``, once Lightning has set up
``torch.distributed``, so it takes this process's rank and world size from it (``batch_size``
is per rank). Lightning leaves an iterable that is not a ``DataLoader`` alone: no sampler is
injected. Each epoch's iterator starts at the batch after the Trainer's ``global_step``
(times ``accumulate_grad_batches``), so Lightning's one-batch look-ahead never counts and a
run resumed from a checkpoint continues the exact stream in O(1). The module's
``state_dict`` (saved in every checkpoint) is the Loader's state: resuming on other data or
with other settings is refused with what changed. ``max_steps`` is needed unless the Loader
has ``epochs=``. Needs ``pip install lightning``; see docs/guides/lightning.md.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

try:
    import lightning as L
except ImportError as e:  # pragma: no cover - exercised only without the package
    raise ImportError("tokenfeed.integrations.lightning needs Lightning: pip install lightning") from e

from ..engine._loader import Loader

__all__ = ["TokenfeedDataModule"]


class _Feed:
    def __init__(self, module: "TokenfeedDataModule", loader: Loader) -> None:
        self.module, self.loader = module, loader

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        trainer = self.module.trainer
        want = self.loader.position
        if trainer is not None:
            want = trainer.global_step * trainer.accumulate_grad_batches * self.loader.global_batch
        if self.loader.position != want:
            state = self.loader.state_dict()
            state["position"] = want
            self.loader.load_state_dict(state)
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


class TokenfeedDataModule(L.LightningDataModule):
    """Training batches from ``tokenfeed.Loader(dataset, **loader_kwargs)``."""

    def __init__(self, dataset: Any, **loader_kwargs: Any) -> None:
        super().__init__()
        self.dataset = dataset
        self.loader_kwargs = loader_kwargs
        self.loader: Optional[Loader] = None
        self._pending: Optional[Dict[str, Any]] = None

    def train_dataloader(self) -> Any:
        if self.loader is None:
            self.loader = Loader(self.dataset, **self.loader_kwargs)
        if self._pending is not None:  # checks the data and settings; the position follows global_step
            self.loader.load_state_dict(self._pending)
            self._pending = None
        return _Feed(self, self.loader)

    def state_dict(self) -> Dict[str, Any]:
        if self.loader is None:
            return {}
        state = self.loader.state_dict()
        if self.trainer is not None:  # what was trained on, not what Lightning fetched ahead
            state["position"] = (self.trainer.global_step * self.trainer.accumulate_grad_batches
                                 * self.loader.global_batch)
        return {"tokenfeed": state}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if "tokenfeed" in state_dict:
            self._pending = dict(state_dict["tokenfeed"])
