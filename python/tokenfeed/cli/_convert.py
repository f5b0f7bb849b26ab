"""``tokenfeed convert``: tokenize text, or convert token files, into a tokenfeed dataset."""
from __future__ import annotations

import argparse
from typing import Any

from ..common._extras import pip_hint
from ..sources._convert import convert
from ..sources._text import EOD_CANDIDATES
from ._common import _progress_option, _source_options

__all__ = ["add_parser", "cmd_convert"]


def cmd_convert(a: argparse.Namespace) -> int:
    return convert(a)


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "convert", usage="tokenfeed convert [options] INPUT [INPUT ...] OUT", help="tokenize text (JSONL, Parquet, plain text) or convert token files into a tokenfeed dataset",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Write a native tokenfeed dataset directory OUT.\n\n"
            "With --tokenizer: INPUTs are text (JSONL with one JSON object per line, Parquet, or plain text;\n"
            "directories are searched for such files; .gz is read for JSONL and text), tokenized in parallel\n"
            "processes with a Hugging Face tokenizers file, with an end-of-document id after every document.\n"
            "Without --tokenizer: INPUTs are token files tokenfeed can read (a tokenfeed dataset, a Megatron\n"
            "prefix, llm.c .bin shards, .npy, raw tokens with --dtype), concatenated in order, documents kept.\n\n"
            "The token dtype follows the vocabulary size: uint8 up to 256, uint16 up to 65536, else uint32.\n"
            "OUT has no manifest until the end, so an interrupted run leaves nothing that opens.\n"
            "--resume (text only) keeps the chunks an interrupted run finished; it refuses when the inputs\n"
            "(path, size, modification time), the tokenizer file or an option that changes the tokens differ."),
        epilog=("examples:\n"
                "  tokenfeed convert corpus/ data/train --tokenizer tokenizer.json --text-field content\n"
                "  tokenfeed convert books/*.txt data/books --tokenizer tokenizer.json --paragraphs\n"
                "  tokenfeed convert corpus/ data/train --tokenizer tokenizer.json --tasks 16 --workers 8\n"
                "  tokenfeed convert gpt2_data/my_text_document data/train --compression zstd\n"
                "  tokenfeed convert data/train data/train-zstd --compression zstd --block-tokens 4096\n"
                "  tokenfeed convert fineweb_train_*.bin data/fineweb --vocab-size 50257\n"
                "  tokenfeed convert tokens.bin data/train --dtype uint16 --vocab-size 50304"))
    c.add_argument("paths", nargs="+", metavar="PATH", help="INPUT files or directories, then the OUT directory")
    g = c.add_argument_group("text input (with --tokenizer)")
    g.add_argument("--tokenizer", metavar="PATH", help="Hugging Face tokenizers file (tokenizer.json)")
    g.add_argument("--input-format", choices=["jsonl", "parquet", "text"],
                   help="input format (default: from the extension: .jsonl/.json/.ndjson, .parquet, .txt/.md)")
    g.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text (default: text)")
    g.add_argument("--meta", metavar="A,B", help="JSONL fields / Parquet columns kept as per-document metadata "
                                                 "columns beside the shards: url,lang,score (docs/views.md)")
    g.add_argument("--paragraphs", action="store_true",
                   help="plain text: one document per blank-line-separated paragraph (default: one per file)")
    g.add_argument("--eod-id", type=int, default=None,
                   help="id appended after every document (default: the tokenizer's "
                        + ", ".join(EOD_CANDIDATES) + ", whichever exists)")
    g.add_argument("--no-eod", action="store_true", help="append nothing after documents")
    g.add_argument("--add-special-tokens", action="store_true",
                   help="let the tokenizer's post-processor add its special tokens (e.g. a BOS) to each document")
    g.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: number of cores)")
    g.add_argument("--tasks", type=int, default=None, metavar="N",
                   help="run the conversion as N datatrove tasks (part k = a contiguous share of the input), "
                        "--workers at a time on datatrove's local executor, then merge the parts without copying; "
                        "needs " + pip_hint("datatrove") + " (see docs/guides/cluster-conversion.md)")
    g.add_argument("--resume", action="store_true",
                   help="continue an interrupted conversion into OUT, keeping the chunks it finished")
    g.add_argument("--chunk-mb", type=float, default=64, help="JSONL bytes per work unit, in MiB (default: 64)")
    g.add_argument("--batch-docs", type=int, default=256, help=argparse.SUPPRESS)
    g.add_argument("--utf8-errors", choices=["strict", "replace", "ignore"], default="strict",
                   help="what to do with invalid UTF-8 in text files (default: strict, stop with an error)")
    t = c.add_argument_group("token input (without --tokenizer)")
    _source_options(t)
    o = c.add_argument_group("output")
    o.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary size to record (default: the tokenizer's, or the input's when it records one, "
                        "else max id + 1 with a note)")
    o.add_argument("--compression", choices=["none", "zstd"], default=None, help="compress token blocks with zstd")
    o.add_argument("--level", type=int, default=3,
                   help="zstd level (default: 3; up to 3, literals are stored raw where Huffman coding saves less "
                        "than a fifth, which decodes ~2x faster; 4 or more: zstd's own choice)")
    o.add_argument("--block-tokens", type=int, default=None, metavar="N",
                   help="tokens per zstd frame (default: 2048, suits a full shuffle at seq_len >= 1024; larger "
                        "blocks compress a little better and suit shuffle='block'; see docs/performance.md)")
    o.add_argument("--shard-tokens", type=int, default=1 << 28, help="tokens per shard (default: 2**28)")
    o.add_argument("--overwrite", action="store_true", help="replace a dataset (or unfinished conversion) in OUT")
    _progress_option(o)
    c.set_defaults(func=cmd_convert)
