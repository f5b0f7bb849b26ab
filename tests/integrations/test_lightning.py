"""tokenfeed.integrations.lightning: Lightning's Trainer (CPU) trains from a
TokenfeedDataModule, stops, resumes from its checkpoint and sees the same batches and
losses as an uninterrupted run; the module's state refuses other data."""
import glob

import pytest


import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

import tokenfeed  # noqa: E402
from conftest import write_eos_documents  # noqa: E402
from tokenfeed.integrations.lightning import TokenfeedDataModule  # noqa: E402


class Tiny(L.LightningModule):
    def __init__(self, seen, losses):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = torch.nn.Embedding(256, 16), torch.nn.Linear(16, 256)
        self.seen, self.losses = seen, losses

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["input_ids"].clone())
        logits = self.out(self.emb(batch["input_ids"]))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def run(data, out, steps, ckpt=None, seed=3):
    seen, losses = [], []
    dm = TokenfeedDataModule(tokenfeed.open(data, dtype="uint16", eos_id=0), seq_len=32, batch_size=4, seed=seed,
                             num_threads=1)
    tr = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=out,
                   callbacks=[ModelCheckpoint(dirpath=out, every_n_train_steps=3, save_top_k=-1)])
    tr.fit(Tiny(seen, losses), datamodule=dm, ckpt_path=ckpt)
    return seen, losses


def test_trainer_stops_and_resumes_exactly(tmp_path):
    data = write_eos_documents(tmp_path / "train.bin")
    full, full_loss = run(data, str(tmp_path / "a"), 6)
    first, first_loss = run(data, str(tmp_path / "b"), 3)
    (ckpt,) = glob.glob(str(tmp_path / "b" / "*step=3.ckpt"))
    assert "tokenfeed" in torch.load(ckpt, weights_only=False)["TokenfeedDataModule"]
    rest, rest_loss = run(data, str(tmp_path / "b"), 6, ckpt=ckpt)
    assert len(full) == 6 and len(first) == 3 and len(rest) == 3
    for a, b in zip(full, first + rest):
        assert torch.equal(a, b)
    assert full_loss == first_loss + rest_loss
    with pytest.raises(tokenfeed.StateError, match="configuration changed"):
        run(data, str(tmp_path / "c"), 6, ckpt=ckpt, seed=4)
