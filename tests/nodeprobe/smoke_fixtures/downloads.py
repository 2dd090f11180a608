"""Fetches its data by URL when it starts, as scripts that download a dataset or a tokenizer on first use
do; the nodes have no route to the host (a name under .invalid, which never resolves)."""
import urllib.request

import torch.distributed as dist

dist.init_process_group(backend="gloo")
with urllib.request.urlopen("https://datasets.example.invalid/shard_000.bin", timeout=10) as response:
    data = response.read()
