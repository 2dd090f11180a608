# ruff: noqa
# Shaped like nanoGPT (train.py + configurator.py + model.py), cut to what ddplab's code check reads.
import torch.nn as nn
class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.lm = nn.Linear(2, 2)
