"""What the slurm role's two helpers answered, read in Python (the tasks only use the result):

    {{ slurm_secrets.stdout | secrets_notes }}   -> `ddplab secrets`'s moves and notes, one line each
    {{ slurm_started.stdout | daemons_changed }} -> whether nodeprobe/daemons.py started or restarted a daemon
"""

from __future__ import annotations

import json


def _answer(stdout) -> dict:
    try:
        out = json.loads(stdout or "{}")
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def secrets_notes(stdout) -> list[str]:
    """One line per key the secrets verb moved ("moved the munge key: ...") and per note it left."""
    out = _answer(stdout)
    return ([f"moved the munge key: {m}" for m in out.get("moved") or []]
            + [f"note: {n}" for n in out.get("left") or []])


def daemons_changed(stdout) -> bool:
    """Whether the daemons step started or restarted any daemon (an error answer changed nothing)."""
    out = _answer(stdout)
    return bool(out.get("started") or out.get("restarted"))


class FilterModule:
    def filters(self):
        return {"secrets_notes": secrets_notes, "daemons_changed": daemons_changed}
