# ruff: noqa
# A flag hard-coded off (as build-nanogpt's `use_compile = False`) or `if False:` guards a branch that never runs.
import torch
import torch.distributed as dist

use_fp8 = False
profile_cuda = False
dist.init_process_group(backend="gloo")
if use_fp8:
    torch.cuda.synchronize()
if False:
    torch.zeros(2).cuda()
x = torch.zeros(2).to("cuda") if profile_cuda else torch.zeros(2)


def step():
    verbose = True
    if not verbose:
        return
    if profile_cuda and verbose:
        torch.cuda.synchronize()


step()
