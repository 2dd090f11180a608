"""The forced command of every relay line in authorized_keys (nodeprobe/relay_access.py writes this file to
``<lab folder>/.relay/receive.py`` and the line runs ``python3 -I <lab folder>/.relay/receive.py``).

A peer's relay key may do one thing: send files into this node's staging folder ``<lab folder>/.relay/
incoming/``, with exactly the rsync options ddplab's own hop uses (ddplab/relay.py ``hop_argv``). The client's
command (``SSH_ORIGINAL_COMMAND``) must be the server side of that hop, word for word::

    rsync --server -trIe.<protocol capabilities> --partial . .

(-r recursive, -t times, -I ignore times, -e.<letters> only announces what the client's rsync supports, no
option). Anything else (--force, --delete*, --remove-source-files, --files-from, --sender (a read), -p,
--chmod, -R, -l/-L, -H, --link-dest, --inplace, a shell command, ...) is refused with one line on stderr and
exit code 1, before rsync runs. The accepted command runs rsync's receiver in the staging folder, never in
the lab tree: its file names cannot climb out of it (rsync refuses ``..`` and absolute names from a sender)
and it holds no symlinks (without -l the receiver makes none). The node's own ddplab step
(nodeprobe/relay_take.py) moves a staged file into place only when its sha256 is the control host's, and
deletes everything else here. Staged files are private (umask 077).

Stdlib only: written by relay_access.py, which is shipped alone.
"""

from __future__ import annotations

import os
import re
import sys

STAGING = "incoming"
# The one command the hop's client sends (its -e capability letters vary with the client's rsync version).
ACCEPTED = re.compile(r"rsync --server -trIe\.[A-Za-z]{0,16} --partial \. \.")


def accepted(command: str) -> list[str] | None:
    """The receiver's argv for the client's ``command``, or None when it is not exactly the hop's."""
    if not ACCEPTED.fullmatch(command):
        return None
    return command.split(" ")


def main() -> int:
    command = os.environ.get("SSH_ORIGINAL_COMMAND", "")
    argv = accepted(command)
    if argv is None:
        shown = command[:200].encode("unicode_escape").decode()
        sys.stderr.write(f"ddplab relay: refused {shown!r}: this key may only send files into the lab's "
                         "staging folder with ddplab's own rsync options\n")
        return 1
    staging = os.path.join(os.path.dirname(os.path.abspath(__file__)), STAGING)
    try:
        folder = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        sys.stderr.write(f"ddplab relay: no staging folder {staging} ({e.strerror}); run "
                         "playbooks/prepare.yml\n")
        return 1
    os.fchdir(folder)
    os.umask(0o077)
    os.execvp("rsync", argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
