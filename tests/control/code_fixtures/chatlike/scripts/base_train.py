# ruff: noqa
# Shaped like nanochat (compute_init, DistAdamW, -m scripts.base_train), cut to what ddplab's code check reads.
import argparse
from nanochat.gpt import GPT
from nanochat.common import compute_init, compute_cleanup, autodetect_device_type

parser = argparse.ArgumentParser()
parser.add_argument("--device-type", type=str, default="")
args = parser.parse_args()
device_type = autodetect_device_type() if args.device_type == "" else args.device_type
ddp, ddp_rank, ddp_local_rank, ddp_world_size, device = compute_init(device_type)
model = GPT()
optimizers = model.setup_optimizers()
compute_cleanup()
