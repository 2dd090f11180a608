# ruff: noqa
# Shaped like nanochat's scripts/base_train.py importing nanochat/engine.py (whose `if __name__ == "__main__":`
# self-test calls torch.cuda.synchronize()): the imported module's main block never runs.
import torch.distributed as dist
from engine import Engine

dist.init_process_group(backend="gloo")
Engine().generate()
