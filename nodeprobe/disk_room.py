"""``nodeprobe disk-room < {"base", "dests"}`` (shipped alone, stdlib only; run by ddplab/disk_room.py over
the control host's own SSH connection before a transfer): the room on the file system that holds ``base``.

``base`` may not exist yet: its nearest existing parent is measured. Prints ``{"path", "free", "replaced"}``:
that folder, its free bytes (statvfs f_bavail: what an unprivileged writer may use), and the bytes of the
regular files among ``dests`` (relative to base) that the transfer rewrites (their old size comes back).
Nothing is written.
"""

from __future__ import annotations

import json
import os
import stat
import sys


def room(base: str, dests: list[str]) -> dict:
    path = os.path.abspath(os.path.expanduser(base))
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    st = os.statvfs(path)
    replaced = 0
    for rel in dests:
        try:
            s = os.lstat(os.path.join(os.path.expanduser(base), rel))
        except OSError:
            continue
        if stat.S_ISREG(s.st_mode):
            replaced += s.st_size
    return {"path": path, "free": st.f_bavail * st.f_frsize, "replaced": replaced}


if __name__ == "__main__":
    spec = json.loads(sys.stdin.read())
    print(json.dumps(room(spec["base"], spec["dests"])))
