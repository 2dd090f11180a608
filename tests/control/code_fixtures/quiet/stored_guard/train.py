# ruff: noqa
# A guard stored in a name whose own name says nothing of CUDA: `accel = torch.cuda.is_available()`, then `if accel:`
import torch
import torch.distributed as dist

accel = torch.cuda.is_available()
many = torch.cuda.device_count() > 1
backend = "nccl" if accel else "gloo"
dist.init_process_group(backend=backend)


def main(local_rank):
    if accel:
        torch.cuda.set_device(local_rank)
    if many:
        torch.cuda.synchronize()
    on_cpu = not accel
    if not on_cpu:
        torch.zeros(2).cuda()


main(0)
