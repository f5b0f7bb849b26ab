"""datatrove pipeline steps that write tokenfeed datasets made of parts.

::

    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from tokenfeed.integrations.datatrove import TokenfeedWriter
    import tokenfeed

    LocalPipelineExecutor(
        pipeline=[JsonlReader("corpus/"), TokenfeedWriter("data/train", tokenizer="tokenizer.json")],
        tasks=64, workers=8, logging_dir="logs/tokenize",
    ).run()
    tokenfeed.merge_parts("data/train")      # or: tokenfeed merge data/train

Task ``k`` of ``n`` writes part ``k`` (``data/train/parts/part-0000k``) with
:class:`tokenfeed.PartWriter`: the part appears only when the task's pipeline has run to
the end, so a task that dies leaves no part, and when the executor runs it again
(datatrove skips the tasks it recorded as complete) its part is written whole, once.
The merged dataset holds part 0's documents in the order the task received them, then
part 1's, and so on; with datatrove's file readers, task ``k`` reads files ``k``,
``k + n``, ``k + 2n``, ... of the sorted file list.

The same step runs under the Slurm and Ray executors; the output directory must be a
filesystem path every task can write (local disk for the local executor, a shared
filesystem on a cluster). Needs ``pip install 'datatrove>=0.5' orjson 'tokenizers>=0.13'``.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..common._extras import pip_hint

try:
    from datatrove.data import Document, DocumentsPipeline
    from datatrove.pipeline.base import PipelineStep
    from datatrove.utils.batching import batched
    from datatrove.utils.logging import logger
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"tokenfeed.integrations.datatrove needs datatrove: {pip_hint('datatrove')}") from e

from ..sources._text import Chunk, ConvertError, Settings, chunk_texts, default_eod, file_sha256, load_tokenizer
from ..sources._parts import PartWriter

__all__ = ["TokenfeedWriter", "ConvertReader", "task_chunks"]


class TokenfeedWriter(PipelineStep):
    """Tokenize datatrove ``Document``\\ s and write this task's part of a tokenfeed dataset.

    Args:
        output_dir: the dataset directory; the part of task ``rank`` goes to
            ``output_dir/parts/part-<rank>``. Join the parts afterwards with
            :func:`tokenfeed.merge_parts` (``tokenfeed merge output_dir``).
        tokenizer: path of a Hugging Face ``tokenizer.json`` (or a ``tokenizers.Tokenizer``).
            ``None`` takes pre-tokenized input: the ids in ``document.metadata[tokens_key]``.
        tokens_key: metadata key of the ids when ``tokenizer`` is ``None``.
        vocab_size: vocabulary size to record; default the tokenizer's (required for
            pre-tokenized input). Every id must be below it.
        eod_id: id appended after every document. ``"auto"`` (the default): the tokenizer's
            ``<|endoftext|>``, ``</s>``, ``<eos>`` or ``<|end_of_text|>``, as ``tokenfeed
            convert`` does (an error if it has none; nothing for pre-tokenized input);
            ``None``: append nothing.
        add_special_tokens: let the tokenizer's post-processor add its special tokens.
        skip_empty: leave out documents whose text is empty or only whitespace (as
            ``tokenfeed convert`` does); they are counted in the ``skipped_empty`` stat.
        batch_size: documents per ``encode_batch`` call.
        shard_tokens, compression, level, block_tokens: as :class:`tokenfeed.DatasetWriter`.

    Documents pass through unchanged, so steps may follow this one. Stats (datatrove's
    per-task and merged tables): ``documents``, ``tokens``, ``skipped_empty``, and the
    time spent tokenizing and writing per batch.
    """

    name = "🧩 tokenfeed writer"
    type = "🔢 - TOKENIZER"

    def __init__(self, output_dir: Union[str, "os.PathLike[str]"], tokenizer: Any = None, *,
                 tokens_key: str = "input_ids", vocab_size: Optional[int] = None,
                 eod_id: Union[int, str, None] = "auto", add_special_tokens: bool = False, skip_empty: bool = True,
                 batch_size: int = 256, shard_tokens: int = 1 << 28, compression: Optional[str] = None,
                 level: int = 3, block_tokens: Optional[int] = None) -> None:
        super().__init__()
        if isinstance(eod_id, str) and eod_id != "auto":
            raise ValueError(f"eod_id must be an int, 'auto' or None, got {eod_id!r}")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.output_dir = os.path.abspath(os.fspath(output_dir))
        self.tokenizer = os.path.abspath(os.fspath(tokenizer)) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
        self.tokens_key = tokens_key
        self.vocab_size = vocab_size
        self.eod_id = eod_id
        self.add_special_tokens = add_special_tokens
        self.skip_empty = skip_empty
        self.batch_size = batch_size
        self.shard_tokens = shard_tokens
        self.compression = compression
        self.level = level
        self.block_tokens = block_tokens
        if tokenizer is None and vocab_size is None:
            raise ValueError("pre-tokenized input (tokenizer=None) needs vocab_size")

    def _setup(self) -> Tuple[Any, int, Optional[int], Dict[str, Any]]:
        """(tokenizer or None, vocab_size, eod_id, settings every part must share)."""
        tok = self.tokenizer
        meta: Dict[str, Any] = {"add_special_tokens": bool(self.add_special_tokens)}
        if isinstance(tok, str):
            meta["tokenizer_sha256"] = file_sha256(tok)
            tok = load_tokenizer(tok)
        elif tok is not None:
            meta["tokenizer_sha256"] = hashlib.sha256(tok.to_str().encode()).hexdigest()
        else:
            meta["tokens_key"] = self.tokens_key
        vocab = int(self.vocab_size) if self.vocab_size is not None else int(tok.get_vocab_size(with_added_tokens=True))
        eod: Optional[int]
        if self.eod_id == "auto":
            if tok is None:
                eod = None
            else:
                found = default_eod(tok)
                if found is None:
                    raise ConvertError("the tokenizer has no end-of-document token (<|endoftext|>, </s>, <eos>, "
                                       "<|end_of_text|>): pass eod_id=ID, or eod_id=None to separate nothing")
                eod = found[1]
        else:
            eod = None if self.eod_id is None else int(self.eod_id)
        if eod is not None and not 0 <= eod < vocab:
            raise ConvertError(f"eod_id {eod} is outside the vocabulary [0, {vocab})")
        meta["eod_id"] = eod
        return tok, vocab, eod, meta

    def _ids(self, tok: Any, batch: List[Document]) -> List[Optional[np.ndarray]]:
        """Token ids of each document of the batch (None: left out as empty)."""
        keep = [d for d in batch if not (self.skip_empty and (not d.text or not d.text.strip()))] \
            if tok is not None else batch
        out: List[Optional[np.ndarray]] = []
        if tok is not None:
            encs = iter(tok.encode_batch([d.text for d in keep], add_special_tokens=self.add_special_tokens))
            kept = set(map(id, keep))
            for d in batch:
                out.append(np.asarray(next(encs).ids, dtype=np.uint32) if id(d) in kept else None)
            return out
        for d in batch:
            if self.tokens_key not in d.metadata:
                raise ConvertError(f"document {d.id}: no metadata[{self.tokens_key!r}] with token ids "
                                   f"(pre-tokenized input, tokenizer=None)")
            ids = np.asarray(d.metadata[self.tokens_key])
            out.append(None if self.skip_empty and ids.size == 0 else ids)
        return out

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        tok, vocab, eod, meta = self._setup()
        eod_arr = None if eod is None else np.array([eod], dtype=np.uint32)
        with PartWriter(self.output_dir, part=rank, parts=world_size, vocab_size=vocab,
                        shard_tokens=self.shard_tokens, compression=self.compression, level=self.level,
                        block_tokens=self.block_tokens, metadata=meta) as w:
            for batch in batched(data or (), self.batch_size):
                with self.track_time(unit="batch"):
                    ids_list = self._ids(tok, batch)
                    for doc, ids in zip(batch, ids_list):
                        if ids is None:
                            self.stat_update("skipped_empty")
                            w.counts["skipped_empty"] = w.counts.get("skipped_empty", 0) + 1
                            continue
                        if eod_arr is not None:  # ids are uint32 from a tokenizer; keep others exact
                            ids = np.concatenate([ids, eod_arr] if ids.dtype == np.uint32
                                                 else [ids.astype(np.int64), eod_arr.astype(np.int64)])
                        try:
                            w.add_document(ids)
                        except ValueError as e:  # an id >= vocab_size
                            raise ConvertError(f"document {doc.id}: {e}") from None
                        self.stat_update("documents")
                        self.stat_update("tokens", value=len(ids))
                for doc in batch:
                    self.update_doc_stats(doc)
                    yield doc
            n_docs, n_tok = w.num_documents, w.num_tokens
        logger.info(f"tokenfeed: part {rank} of {world_size} published: {n_docs:,} documents, {n_tok:,} tokens "
                    f"in {w.final_path}")


def task_chunks(chunks: Sequence[Chunk], rank: int, world_size: int) -> List[Chunk]:
    """Task ``rank``'s share of ``chunks``: a contiguous run, cut where the cumulative
    weight (bytes) crosses ``k / world_size`` of the total, so that the parts in task
    order hold the documents in input order."""
    total = sum(c.weight for c in chunks)
    if total == 0:
        lo, hi = len(chunks) * rank // world_size, len(chunks) * (rank + 1) // world_size
        return list(chunks[lo:hi])

    def cut(k: int) -> int:
        target, acc = total * k / world_size, 0
        for i, c in enumerate(chunks):
            if acc >= target:
                return i
            acc += c.weight
        return len(chunks)

    return list(chunks[cut(rank):cut(rank + 1)])


class ConvertReader(PipelineStep):
    """Read the inputs of ``tokenfeed convert`` (JSONL, Parquet, plain text, ``.gz``) as
    datatrove Documents, with the conversion's own parsing and error messages.

    The inputs are cut into chunks (``tokenfeed.cli``'s planner: byte ranges of JSONL
    files, Parquet row groups, text files) and task ``k`` reads a contiguous run of them
    (:func:`task_chunks`), so merging the parts gives the documents in input order: the
    same order as a single-process ``tokenfeed convert``. Missing (null) texts are passed
    on as empty documents, which :class:`TokenfeedWriter` leaves out and counts.
    """

    name = "📖 tokenfeed inputs"
    type = "📖 - READER"

    def __init__(self, chunks: Sequence[Chunk], settings: Settings) -> None:
        super().__init__()
        self.chunks = [Chunk(*c) for c in chunks]
        self.settings = Settings(*settings)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> Iterator[Document]:
        if data:
            yield from data
        mine = task_chunks(self.chunks, rank, world_size)
        logger.info(f"tokenfeed: task {rank} of {world_size} reads {len(mine)} of {len(self.chunks)} chunks")
        for c in mine:
            self.stat_update("input_chunks")
            n = 0
            for text in chunk_texts(c, self.settings):
                yield Document(text=text or "", id=f"{c.path}#{c.start}:{n}")
                n += 1
            self.stat_update("documents", value=n, unit="input_chunk")
