"""A distributed program without an optimizer (a probe): a gloo group and one all_reduce, then exit 0."""
import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
x = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(x)
assert int(x[0]) == 3
dist.destroy_process_group()
