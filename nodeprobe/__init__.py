"""ddplab's node-side package: everything that runs on a node.

Synced to every node beside ``trainer/`` and run there as ``python -m nodeprobe <cmd>``: preflight's
probes (fingerprint, gather, listen/connect, port-holder, lab-processes, resolve, iface, gloo-smoke and
the spec-driven ``preflight-*`` steps), ``route`` (roles/gloo_network), ``run-status`` (roles/launch)
and ``verify-shards`` (roles/dataset). Each command prints ONE JSON object on stdout and exits 0 when
the probe ran (the finding is in the JSON); a usage error exits 2 with one line on stderr.

Three ways a node runs this code, and which modules each may use:

- ``python -m nodeprobe VERB`` (or ``-m nodeprobe.X``) from the synced code folder, with Ansible's
  interpreter or the run's pinned Python: any module here, and torch where the verb needs it
  (``fingerprint``, ``smoke`` (gloo-smoke) and ``smoke_rank`` (inside the user's ranks of a smoke run)).
- Alone, before the synced code exists: the modules named in ``SHIPPED_ALONE``, each read on the control
  host by the lookup ``ddplab_node_program`` (plugins/lookup/, which refuses any other name) and run as the
  program on stdin of ``python -I -`` (one round trip; ``-I``: neither the working folder nor PYTHON*
  variables nor user site-packages reach ``sys.path``, so a ``json.py`` in the login's home is never
  imported, by the user's probes or by root's). They import the standard library only
  (tests/nodeprobe/test_shipped_alone.py runs each with no site-packages at all).
"""

PROBE_VERSION = 1

# Shipped alone (see above): prereqs (node_prereqs, first of all), hashing (code_sync hashes the node's copy
# before copying), torch_candidates (torch_env, before any venv), procs (stale_processes, also from stop.yml),
# site_probe (torch_env: what the node's Python has installed), relay_access (relay_ssh: the node's relay key,
# its peers' authorized_keys lines), relay_receive (relay_ssh writes it: the forced command of those lines),
# relay_take (shipped by ddplab/relay.py, not a role: a relayed batch into place), daemons (slurm: munged,
# slurmctld and slurmd where the node has no systemd), lab_dirs (ddplab's dirs: the lab folders, 0700).
SHIPPED_ALONE = ("prereqs", "lab_dirs", "hashing", "torch_candidates", "procs", "site_probe", "relay_access",
                 "relay_receive", "relay_take", "daemons")
