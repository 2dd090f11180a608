"""A group and a collective each step (the loss, for logging), but each rank starts from its own seed
and its gradients are never averaged: the ranks' parameters differ."""
import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
torch.manual_seed(dist.get_rank())
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    logged = loss.detach().clone()
    dist.all_reduce(logged)
    opt.step()
    opt.zero_grad()
