"""Datasets: opening path specs (local files, URLs, shard sets), the formats' Python faces, columns, writers,
parts joined by a manifest, text-to-token conversion, the Megatron index cache reader."""
