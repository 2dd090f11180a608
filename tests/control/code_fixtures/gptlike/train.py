# ruff: noqa
# Shaped like nanoGPT (train.py + configurator.py + model.py), cut to what ddplab's code check reads.
import os
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
from model import GPT

out_dir = 'out'
backend = 'nccl'
device = 'cuda'
exec(open('configurator.py').read())
ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    init_process_group(backend=backend)
    ddp_local_rank = int(os.environ['LOCAL_RANK'])
    device = f'cuda:{ddp_local_rank}'
    torch.cuda.set_device(device)
device_type = 'cuda' if 'cuda' in device else 'cpu'

def get_batch(split):
    x = torch.zeros(4)
    if device_type == 'cuda':
        x = x.pin_memory().to(device, non_blocking=True)
    else:
        x = x.to(device)
    return x

model = GPT()
model.to(device)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
X = get_batch('train')
if ddp:
    destroy_process_group()
