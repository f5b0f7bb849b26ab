"""One module per loader. Each exposes ``open(case) -> Feed`` and may expose
``prepare(case)`` (convert the shared token file into its own format, cached),
``restore(case, position) -> Feed`` (its own resumable state) and ``version()``.

A case is a dict built by the parent (see ``tokenfeed_bench.suites``): ``raw`` (flat
token file), ``raw_dtype``, ``seq_len``, ``batch_size``, ``seed``, ``samples`` (the
shared shuffled sample list, .npy), ``workers``, ``peer_dir`` (where converted data is
cached), ``shards`` (start-up layouts) and loader-specific keys.
"""
