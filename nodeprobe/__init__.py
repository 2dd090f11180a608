"""Node-side probes for ddplab's preflight.

Copied to every node beside ``trainer/`` and run there with the node's pinned python as
``python -m nodeprobe <cmd>``. Each command prints ONE JSON object on stdout and exits 0 when the
probe ran (the finding is in the JSON); a usage error exits 2 with one line on stderr.

Only ``fingerprint`` and ``gloo-smoke`` import torch; the network and process probes are stdlib
only so they answer in milliseconds. ``nodeprobe.verdict`` and ``nodeprobe.hashing`` are stdlib only
and run on the control host.
"""

PROBE_VERSION = 1
