"""ddplab's node-side package: everything that runs on a node.

Synced to every node beside ``trainer/`` and run there as ``python -m nodeprobe <cmd>``: preflight's
probes (fingerprint, gather, listen/connect, port-holder, lab-processes, resolve, iface, gloo-smoke and
the spec-driven ``preflight-*`` steps), ``route`` (roles/gloo_network), ``run-status`` (roles/launch)
and ``verify-shards`` (roles/dataset). Each command prints ONE JSON object on stdout and exits 0 when
the probe ran (the finding is in the JSON); a usage error exits 2 with one line on stderr.

One way a node runs this code: a role's task ``ddplab_node: {nodeprobe: VERB}`` (ddplab/node_command.py
chooses the interpreter and the code folder from the two lists below).

- ``python -m nodeprobe VERB`` from the synced code folder: any module here, with Ansible's interpreter, or
  for a verb of ``PINNED_PYTHON`` (those import torch: ``fingerprint`` and ``smoke`` in preflight's steps,
  ``smoke_rank`` inside the user's ranks of a smoke or tune run) the Python the lab's record names.
- Alone, before the synced code exists: the modules named in ``SHIPPED_ALONE`` (the verb ``lab-dirs`` is
  lab_dirs.py), each read on the control host by the plugin (which refuses any other name) and run as the
  first characters of stdin of ``python -I -c BOOT LENGTH``, its input after them (one round trip; ``-I``:
  neither the working folder nor PYTHON* variables nor user site-packages reach ``sys.path``, so a
  ``json.py`` in the login's home is never imported, by the user's probes or by root's). They import the
  standard library only (tests/nodeprobe/test_shipped_alone.py runs each with no site-packages at all).
"""

PROBE_VERSION = 1

# Shipped alone (see above): prereqs (node_prereqs, first of all), hashing (code_sync hashes the node's copy
# before copying), torch_candidates (torch_env, before any venv), procs (stale_processes, also from stop.yml),
# site_probe (torch_env: what the node's Python has installed), relay_access (relay_ssh: the node's relay key,
# its peers' authorized_keys lines), relay_receive (relay_ssh writes it: the forced command of those lines),
# relay_take (code_sync's ddplab_node_argv lookup names it, ddplab/relay.py runs it: a relayed batch into
# place), daemons (slurm: munged, slurmctld and slurmd where the node has no systemd), lab_dirs (ddplab's
# dirs: the lab folders, 0700), firewall_read (firewall: ufw's rules and root's records of the labs' tags),
# disk_room (the transfers, ddplab/disk_room.py: the room under a node folder before a byte travels).
SHIPPED_ALONE = ("prereqs", "lab_dirs", "hashing", "torch_candidates", "procs", "site_probe", "relay_access",
                 "relay_receive", "relay_take", "daemons", "firewall_read", "disk_room")

# Verbs run with the lab's pinned Python (the one with torch), read from the lab's record on the node:
# preflight's steps (one interpreter for all, "not prepared" when there is none), the smoke and tune runs, and
# the compile cache's seed (torch's own cache layout and fingerprint).
PINNED_PYTHON = ("preflight-gather", "preflight-connect", "preflight-smoke", "preflight-outside",
                 "preflight-outside-stop", "code-smoke", "code-tune", "compile-seed")
