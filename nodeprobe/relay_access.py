"""``python3 -I - SPEC < relay_access.py`` (shipped alone as the program on stdin, stdlib only; SPEC is
JSON): the lab key's entry in the run user's authorized_keys, added, replaced or removed; nothing else in
the file is touched.

The entry lets the lab's relay key (roles/relay_ssh) do one thing: rsync *into* the lab folder, through
rrsync (rsync's own restricted-rsync wrapper) as the forced command::

    restrict,from="10.0.0.5,10.0.0.6",command="/usr/bin/rrsync -wo -no-del -munge /home/me/ddplab"
      ssh-ed25519 AAAA... ddplab-relay:/home/me/ddplab        (one line)

``restrict`` turns off port, agent and X11 forwarding and the pty; ``command=`` runs rrsync whatever the
client asked for (a shell command is refused by rrsync: it accepts only ``rsync --server``), ``-wo``
receives only, ``-no-del`` refuses --delete/--remove, ``-munge`` keeps symlinks from leading out of the
folder. The comment ``ddplab-relay:<lab folder>`` marks the line as ddplab's: a second lab folder of the
same user has its own line.

Spec: ``{"state": "present" | "absent" | "probe", "root": lab folder, "pubkey": "ssh-ed25519 AAAA...",
"from": [addresses], "authorized_keys": path ("~" allowed)}``. Prints ``{"changed": bool, "rrsync": path
or "", "rsync": path or ""}`` (present: an empty rrsync means no entry was written: relay is not possible).
``probe`` (check mode) reports what ``present`` would do and writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

MARK = "ddplab-relay:"
RRSYNC_FLAGS = ("-wo", "-no-del", "-munge")
# Debian 12 installs rrsync as /usr/bin/rrsync; older packages kept it among the docs.
RRSYNC_PLACES = ("/usr/bin/rrsync", "/usr/share/doc/rsync/scripts/rrsync")
UNSAFE = set('"\\\n\r,') | {" "}


def find_rrsync() -> str:
    return shutil.which("rrsync") or next((p for p in RRSYNC_PLACES if os.access(p, os.X_OK)), "")


def entry(rrsync: str, root: str, pubkey: str, sources: list[str]) -> str:
    """The one line; ``root`` and the addresses must hold no quote, comma, space or backslash."""
    bad = [v for v in [root, rrsync, *sources] if UNSAFE & set(v)]
    if bad or len(pubkey.split()) < 2:
        raise ValueError(f"cannot write a safe authorized_keys entry for {bad or pubkey!r}")
    options = ["restrict"]
    if sources:
        options.append(f'from="{",".join(sources)}"')
    options.append(f'command="{" ".join([rrsync, *RRSYNC_FLAGS, root])}"')
    key = " ".join(pubkey.split()[:2])
    return f"{','.join(options)} {key} {MARK}{root}"


def is_ours(line: str, root: str) -> bool:
    return line.rstrip().endswith(f" {MARK}{root}")


def updated(text: str, root: str, line: str | None) -> str:
    """``text`` without our line for ``root``, plus ``line`` (when given) at the end."""
    kept = [ln for ln in text.splitlines() if not is_ours(ln, root)]
    if line is not None:
        kept.append(line)
    return "".join(ln + "\n" for ln in kept)


def write(path: str, text: str) -> None:
    """Atomically, keeping its mode; a symlinked authorized_keys keeps its link (the target changes)."""
    path = os.path.realpath(path)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o600
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".authorized_keys.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def apply(spec: dict) -> dict:
    path = os.path.expanduser(spec.get("authorized_keys") or "~/.ssh/authorized_keys")
    root = spec["root"]
    rrsync, rsync = find_rrsync(), shutil.which("rsync") or ""
    try:
        with open(path) as f:
            before = f.read()
    except FileNotFoundError:
        before = None
    line = None
    if spec["state"] in ("present", "probe") and rrsync and rsync:
        line = entry(rrsync, root, spec["pubkey"], list(spec.get("from") or []))
    after = updated(before or "", root, line)
    changed = after != (before or "") and not (before is None and line is None)
    if changed and spec["state"] != "probe":
        write(path, after)
    return {"changed": changed, "rrsync": rrsync, "rsync": rsync}


if __name__ == "__main__":
    print(json.dumps(apply(json.loads(sys.argv[1]))))
