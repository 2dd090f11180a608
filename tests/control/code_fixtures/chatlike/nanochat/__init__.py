# ruff: noqa
# Shaped like nanochat (compute_init, DistAdamW, -m scripts.base_train), cut to what ddplab's code check reads.
