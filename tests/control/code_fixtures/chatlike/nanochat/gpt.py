# ruff: noqa
# Shaped like nanochat (compute_init, DistAdamW, -m scripts.base_train), cut to what ddplab's code check reads.
import torch.nn as nn
from nanochat.common import get_dist_info
from nanochat.adamw import DistAdamW

class GPT(nn.Module):
    def setup_optimizers(self):
        ddp, rank, local_rank, world_size = get_dist_info()
        AdamWFactory = DistAdamW if ddp else torch.optim.AdamW
        return AdamWFactory(self.parameters())
