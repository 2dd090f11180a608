"""Needs a package the nodes were not given (scikit-learn, imported as sklearn; not in ddplab's venv)."""
import torch
import torch.distributed as dist
from sklearn.metrics import accuracy_score

dist.init_process_group(backend="gloo")
print(accuracy_score([1, 0], [1, 1]), torch.__version__)
