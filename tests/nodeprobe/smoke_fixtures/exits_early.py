"""Exits 0 on a machine without CUDA, before any training (a 'no GPU, nothing to do' guard)."""
import sys

import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
if not torch.cuda.is_available():
    print("no GPU found; nothing to train")
    sys.exit(0)
