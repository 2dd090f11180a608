"""The lab's tag: a short name that tells this lab apart from another on the same machines or control host.

Two labs differ by their master or by the master's lab folder, so the tag is the first 8 hex digits of
the sha256 of ``<master address>:<master's ddplab_root>`` as the inventory writes them (no node is asked:
the tag is known before any SSH). It names

- the lab's Slurm jobs: ``ddplab-<tag>-<run id>`` (``slurm_job_prefix``), so launch, stop, status and wait
  see only this lab's jobs among the run user's own (``squeue --me``), never another lab folder's;
- the lab's folder of control-side secrets (``ddplab_secrets_dir``'s default ``~/.config/ddplab/<tag>``), so
  two labs do not share a key unless the inventory says so;
- the comment on the lab's firewall rules: ``ddplab-lab-<tag>`` (``rule_comment``; roles/firewall), so two
  labs with one master, in two lab folders, never take each other's rules for their own.

plugins/lookup/ddplab_lab_id.py hands both to the playbooks.
"""

from __future__ import annotations

import hashlib

TAG_HEX = 8
JOB_PREFIX = "ddplab-"
RULE_PREFIX = "ddplab-lab-"


def lab_tag(master_addr: str, master_root: str) -> str:
    """8 hex digits of sha256("<master address>:<master's ddplab_root>")."""
    return hashlib.sha256(f"{master_addr}:{master_root}".encode()).hexdigest()[:TAG_HEX]


def slurm_job_prefix(tag: str) -> str:
    """What every Slurm job name of the lab with `tag` starts with (the run id follows)."""
    return f"{JOB_PREFIX}{tag}-"


def rule_comment(tag: str) -> str:
    """The comment on every firewall rule of the lab with `tag`."""
    return f"{RULE_PREFIX}{tag}"


def retired_rule_comment(master_addr: str, node_root: str) -> str:
    """The comment the firewall role wrote before the tag had this one home: the master's address and 8 hex
    digits of sha256(this node's lab folder). Only to know such a rule of this lab as a leftover to remove."""
    folder = hashlib.sha256(node_root.encode()).hexdigest()[:TAG_HEX]
    return f"{RULE_PREFIX}{master_addr}-{folder}"


def secrets_dir(setting: str, tag: str, home: str) -> str:
    """The lab's folder of control-side secrets: ddplab_secrets_dir (a leading ~ is `home`), else
    <home>/.config/ddplab/<tag>."""
    if not setting:
        return f"{home}/.config/ddplab/{tag}"
    return home + setting[1:] if setting == "~" or setting.startswith("~/") else setting
