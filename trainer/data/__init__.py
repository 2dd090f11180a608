"""Training data: parquet shards (nanochat's format) + manifest, a byte-level tokenizer, a resumable loader.

- ``corpus``: the documents (the deterministic built-in text, or a folder of .txt/.jsonl/.parquet).
- ``shards``: writing, reading and verifying ``shard_*.parquet`` + ``manifest.json``.
- ``tokenizer``: bytes as token ids, with a document separator.
- ``loader``: row groups strided by rank, (x, y) batches, and the resumable position.
- ``__main__``: ``python -m trainer.data prepare|verify`` (docs/contracts.md).
"""
