"""tokenfeed.integrations.hf: transformers' Trainer (a tiny randomly initialised Llama built
from a config, on CPU) trains from a Loader, stops, resumes from its checkpoint and sees the
same batches and losses as an uninterrupted run."""

import accelerate  # noqa: E402,F401  (the Trainer needs it; the test extra installs it)

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback, TrainingArguments  # noqa: E402

import tokenfeed  # noqa: E402
from conftest import write_eos_documents  # noqa: E402
from tokenfeed.integrations.hf import TokenfeedTrainer, causal_lm_batch  # noqa: E402

SEQ, ROWS = 32, 4


class StopAt(TrainerCallback):
    """Stop (and checkpoint) at a step, as a preempted job would."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            control.should_training_stop = True
            control.should_save = True


class Recording(TokenfeedTrainer):
    def __init__(self, *a, seen, **kw):
        super().__init__(*a, **kw)
        self.seen = seen

    def training_step(self, model, inputs, *a, **kw):
        self.seen.append(inputs["input_ids"].clone())
        return super().training_step(model, inputs, *a, **kw)


def run(data, out, stop=None, resume=None):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ))
    loader = tokenfeed.Loader(tokenfeed.open(data, dtype="uint16", eos_id=0), seq_len=SEQ, batch_size=ROWS, seed=3,
                              loss_mask=True, num_threads=1)
    args = TrainingArguments(out, max_steps=6, save_steps=3, logging_steps=1, report_to=[], use_cpu=True, seed=0,
                             disable_tqdm=True)
    seen = []
    tr = Recording(model=model, args=args, train_loader=loader, seen=seen,
                   callbacks=[StopAt(stop)] if stop else None)
    tr.train(resume_from_checkpoint=resume)
    losses = [h["loss"] for h in tr.state.log_history if "loss" in h]
    return seen, losses


def test_trainer_stops_and_resumes_exactly(tmp_path):
    data = write_eos_documents(tmp_path / "train.bin")
    full, full_loss = run(data, str(tmp_path / "a"))
    first, _ = run(data, str(tmp_path / "b"), stop=3)
    rest, loss = run(data, str(tmp_path / "b"), resume=True)
    assert len(full) == 6 and len(first) == 3 and len(rest) == 3
    for a, b in zip(full, first + rest):
        assert torch.equal(a, b)
    assert loss == full_loss  # the resumed history: 3 restored losses, then 3 trained ones


def test_labels_skip_document_starts():
    ids = torch.tensor([[5, 6, 0, 7, 8]])
    # the Loader's loss_mask[t] is 0 when token t + 1 opens a document: 7, after the eos 0
    mask = torch.tensor([[1, 1, 0, 1, 1]], dtype=torch.uint8)
    out = causal_lm_batch({"input_ids": ids, "loss_mask": mask})
    assert out["labels"].tolist() == [[5, 6, 0, -100, 8]]  # HF shifts: position 3 is predicted from 0
    assert causal_lm_batch({"input_ids": ids})["labels"].tolist() == ids.tolist()
