# ruff: noqa
# Shaped like nanoGPT (train.py + configurator.py + model.py), cut to what ddplab's code check reads.
# configurator
