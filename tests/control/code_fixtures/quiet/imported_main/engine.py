# ruff: noqa
import torch


def autodetect_device_type():
    return "cuda" if torch.cuda.is_available() else "cpu"


def cuda_only_selftest():
    torch.cuda.set_device(0)


class Engine:
    def generate(self):
        return torch.zeros(2)


if __name__ == "__main__":
    import time
    device_type = autodetect_device_type()
    torch.cuda.synchronize()
    t0 = time.time()
    cuda_only_selftest()
    torch.cuda.synchronize()
