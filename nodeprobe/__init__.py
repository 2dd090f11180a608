"""ddplab's node-side package: everything that runs on a node.

Synced to every node beside ``trainer/`` and run there as ``python -m nodeprobe <cmd>``: preflight's
probes (fingerprint, gather, listen/connect, port-holder, lab-processes, resolve, iface, gloo-smoke and
the spec-driven ``preflight-*`` steps), ``route`` (roles/gloo_network), ``run-status`` (roles/launch)
and ``verify-shards`` (roles/dataset). Each command prints ONE JSON object on stdout and exits 0 when
the probe ran (the finding is in the JSON); a usage error exits 2 with one line on stderr.

These modules also run alone where the synced code may not exist yet (stdlib only, no package imports),
each as the program on stdin of ``python -I -`` (one round trip; ``-I``: neither the working folder nor
PYTHON* variables nor user site-packages reach ``sys.path``, so a ``json.py`` in the login's home is never
imported, by the user's probes or by root's): ``prereqs.py`` (node_prereqs, first of all), ``hashing.py``
(code_sync hashes the node's copy before copying), ``torch_candidates.py`` (torch_env, before any venv)
and ``procs.py`` (stale_processes, also from stop.yml). Only ``fingerprint`` and ``gloo-smoke`` import
torch; the rest is stdlib only.
"""

PROBE_VERSION = 1
