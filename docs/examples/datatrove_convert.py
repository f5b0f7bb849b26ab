"""Tokenize a folder of JSONL (or Parquet) files into a tokenfeed dataset with datatrove.

::

    pip install 'datatrove>=0.5' orjson 'tokenizers>=0.13'
    python docs/examples/datatrove_convert.py corpus/ data/train tokenizer.json --tasks 64 --workers 8

Each of the ``--tasks`` datatrove tasks reads its share of the files (datatrove gives
task k files k, k + T, k + 2T, ... of the sorted list), tokenizes them and writes one
part of the dataset (``data/train/parts/part-0000k``); ``--workers`` tasks run at a time
on this machine. When all tasks are done, the parts are merged: ``data/train`` then
opens as one dataset (``tokenfeed.open("data/train")``), part 0's documents first. No
token data is copied by the merge.

The defaults are those of ``tokenfeed convert``: the text is the ``text`` field
(``--text-field``), documents with empty text are left out, and the tokenizer's
end-of-document token (``<|endoftext|>``, ``</s>``, ``<eos>`` or ``<|end_of_text|>``) is
appended after every document (``--eod-id ID`` to choose one, ``--no-eod`` for none).

Run it again after a crash or a kill: datatrove skips the tasks it recorded as complete
(in ``--logging-dir``), the others write their parts again from scratch, and the merge
sees each part exactly once. ``--executor ray`` runs the same pipeline on a Ray cluster
(``ray.init()`` connects to the one in ``RAY_ADDRESS``, or starts a local one); the
output directory must then be a filesystem every Ray worker can write.
"""
from __future__ import annotations

import argparse
import os
import sys

import tokenfeed
from tokenfeed.integrations.datatrove import TokenfeedWriter


def reader_for(input_dir: str, text_field: str):
    """datatrove's own reader for the files in input_dir: Parquet if there are .parquet files, else JSONL."""
    names = [f for _, _, files in os.walk(input_dir) for f in files]
    if any(n.endswith(".parquet") for n in names):
        from datatrove.pipeline.readers import ParquetReader

        return ParquetReader(input_dir, text_key=text_field, glob_pattern="**/*.parquet")
    from datatrove.pipeline.readers import JsonlReader

    pattern = "**/*.jsonl.gz" if any(n.endswith(".jsonl.gz") for n in names) else "**/*.jsonl"
    return JsonlReader(input_dir, text_key=text_field, glob_pattern=pattern)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input_dir", help="folder of .jsonl (or .jsonl.gz, or .parquet) files, searched recursively")
    ap.add_argument("output_dir", help="the tokenfeed dataset to write")
    ap.add_argument("tokenizer", help="Hugging Face tokenizers file (tokenizer.json)")
    ap.add_argument("--tasks", type=int, default=4, help="datatrove tasks, one part each (default: 4)")
    ap.add_argument("--workers", type=int, default=None, help="tasks run at a time (default: number of cores)")
    ap.add_argument("--text-field", default="text", help="JSONL field / Parquet column of the text (default: text)")
    ap.add_argument("--eod-id", type=int, default=None, help="id appended after every document "
                                                             "(default: the tokenizer's end-of-document token)")
    ap.add_argument("--no-eod", action="store_true", help="append nothing after documents")
    ap.add_argument("--logging-dir", default=None,
                    help="datatrove's logs and completion records (default: OUTPUT_DIR.logs)")
    ap.add_argument("--executor", choices=["local", "ray"], default="local")
    a = ap.parse_args(argv)

    # the tasks are the parallelism: one tokenizer thread each
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    eod = None if a.no_eod else (a.eod_id if a.eod_id is not None else "auto")
    pipeline = [
        reader_for(a.input_dir, a.text_field),
        TokenfeedWriter(a.output_dir, tokenizer=a.tokenizer, eod_id=eod),
    ]
    logging_dir = a.logging_dir or a.output_dir.rstrip("/") + ".logs"
    workers = a.workers or os.cpu_count() or 1
    if a.executor == "ray":
        import ray
        from datatrove.executor.ray import RayPipelineExecutor

        if not ray.is_initialized():
            ray.init()
        executor = RayPipelineExecutor(pipeline, tasks=a.tasks, workers=workers, logging_dir=logging_dir)
    else:
        from datatrove.executor import LocalPipelineExecutor

        executor = LocalPipelineExecutor(pipeline, tasks=a.tasks, workers=workers, logging_dir=logging_dir)
    executor.run()

    missing = executor.get_incomplete_ranks()
    if missing:
        print(f"{len(missing)} of {a.tasks} tasks did not finish (see {logging_dir}); run this command again",
              file=sys.stderr)
        return 1
    ds = tokenfeed.merge_parts(a.output_dir)
    print(f"wrote {a.output_dir}: {ds.num_tokens:,} tokens, {ds.num_documents:,} documents in {a.tasks} parts, "
          f"fingerprint {ds.fingerprint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
