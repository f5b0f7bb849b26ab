"""Hugging Face ``transformers.Trainer`` fed by a :class:`tokenfeed.Loader`.

::

    import tokenfeed
    from tokenfeed.integrations.hf import TokenfeedTrainer

    loader = tokenfeed.Loader("data/train", seq_len=2048, batch_size=8, seed=0, loss_mask=True)
    trainer = TokenfeedTrainer(model=model, args=TrainingArguments("out", max_steps=10_000, save_steps=500),
                               train_loader=loader)
    trainer.train()                         # resume: trainer.train(resume_from_checkpoint=True)

The Trainer draws its batches from the Loader (its ``batch_size`` is per data-parallel
rank; rank and world come from ``torch.distributed``, which the Trainer has set up), not
from a ``DataLoader`` it builds. Each batch is ``input_ids`` and ``labels`` for a causal LM,
which shifts the labels itself: ``labels`` are the inputs, with -100 where a label opens a
new document (the Loader's ``loss_mask``). On resume the Loader is moved to the batch after
the checkpoint's ``global_step`` (times gradient accumulation) in O(1), so no batch is read
to be skipped (``ignore_data_skip`` is set for that reason). ``max_steps`` is required: the
stream has no length unless the Loader has ``epochs=``. Needs ``pip install transformers``;
see docs/guides/hf-trainer.md.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator

try:
    from transformers import Trainer
except ImportError as e:  # pragma: no cover - exercised only without the package
    raise ImportError("tokenfeed.integrations.hf needs transformers: pip install transformers") from e

from ..engine._loader import Loader

__all__ = ["TokenfeedTrainer", "causal_lm_batch"]


def causal_lm_batch(batch: Dict[str, Any]) -> Dict[str, Any]:
    """``input_ids`` and Hugging Face ``labels`` (-100 where not trained) from a Loader batch."""
    ids = batch["input_ids"]
    labels = ids.clone()
    if "loss_mask" in batch:  # loss_mask[t] is about predicting token t + 1
        labels[:, 1:][batch["loss_mask"][:, :-1] == 0] = -100
    return {"input_ids": ids, "labels": labels}


class _Feed:
    """What get_train_dataloader returns: the Loader's batches from the step the Trainer is at."""

    def __init__(self, trainer: "TokenfeedTrainer") -> None:
        self.trainer = trainer

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        loader = self.trainer.train_loader
        steps = self.trainer.state.global_step * self.trainer.args.gradient_accumulation_steps
        want = steps * loader.global_batch
        if loader.position != want:
            state = loader.state_dict()
            state["position"] = want
            loader.load_state_dict(state)
        for b in loader:
            yield causal_lm_batch(b)


class TokenfeedTrainer(Trainer):
    """A ``transformers.Trainer`` whose training batches come from ``train_loader``."""

    def __init__(self, *args: Any, train_loader: Loader, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(train_loader, Loader):
            raise TypeError(f"train_loader must be a tokenfeed.Loader, got {type(train_loader).__name__}")
        self.train_loader = train_loader
        # the Loader seeks to the checkpoint's step itself: nothing to read and discard
        self.args.ignore_data_skip = True

    def get_train_dataloader(self) -> Any:
        return _Feed(self)

