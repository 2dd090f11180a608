"""``nodeprobe relay-access < SPEC`` (shipped alone: the program first on stdin, its SPEC, JSON, after it;
stdlib only): this node's side of the relay's node-to-node SSH (roles/relay_ssh), one call per prepare.

One key per node: each node makes its own relay key pair in ``<lab folder>/.relay/`` (``keys``); the private
key never leaves the node, the control host reads only the public key. Each peer's key gets one line in the
run user's authorized_keys (``present``)::

    restrict,from="10.0.0.6",command="/usr/bin/python3 -I /home/me/ddplab/.relay/receive.py"
      ssh-ed25519 AAAA... ddplab-relay:/home/me/ddplab node1                                 (one line)

``restrict`` turns off port, agent and X11 forwarding and the pty; ``from=`` holds that peer's IP address
(sshd compares addresses; a host name would need UseDNS, off by default); ``command=`` runs the receiver
(nodeprobe/relay_receive.py, written here as ``.relay/receive.py``; the key can write only into
``.relay/incoming/``, so not there) whatever the client asked for. The comment ``ddplab-relay:<lab folder>
<peer>`` marks the line as this lab folder's (a second lab folder of the same user keeps its own lines).

The lines follow the inventory on every prepare: ``present`` writes the lines of the peers given, keeps the
lines of inventory nodes outside this play (--limit: their keys were not read) and removes every other line of
this lab folder (a node that left the inventory loses its access; a line from before one key per node, without
a peer name, goes too); ``absent`` (a star prepare) removes all of this lab folder's lines and empties the
staging folder; ``forget`` (stop.yml's cleanup) also removes what ``keys`` and ``present`` placed in
``.relay/`` and the folder when nothing else is in it. Nothing else in authorized_keys is touched.

Spec: ``{"state": "keys" | "present" | "absent" | "forget", "root": lab folder, "check": bool,
"authorized_keys": path ("~" allowed)}``, plus for ``keys`` ``"addr"``, ``"port"`` (where this node's SSH
server is read with ssh-keyscan), for ``present`` ``"name"`` (this node), ``"inventory"`` (every node's
name), ``"peers": [{"name", "from": [IP addresses], "pubkey"}]``, ``"known_hosts"`` (the lab's, assembled on
the control host), ``"receiver"`` (relay_receive.py's source). Prints ``{"changed": bool}``, for ``keys`` also
``"pubkey"`` ("" in check mode before the key exists), ``"rsync"`` (its path or "") and ``"host_keys"``.
With ``check`` nothing is written.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile

MARK = "ddplab-relay:"
RELAY_DIR = ".relay"
KEY = "id_ed25519"
KNOWN_HOSTS = "known_hosts"
RECEIVER = "receive.py"
STAGING = "incoming"
# The files ``keys`` and ``present`` place in .relay besides the STAGING folder, and relay_take.py's HOLD
# (forget removes them).
PLACED = (KEY, f"{KEY}.pub", KNOWN_HOSTS, RECEIVER, "taking")
UNSAFE = set('"\\\n\r,\'') | {" ", "\t"}
KEYSCAN_TIMEOUT_S = 5


def relay_dir(root: str) -> str:
    return os.path.join(root, RELAY_DIR)


def entry(python: str, root: str, peer: str, pubkey: str, sources: list[str]) -> str:
    """The line that lets ``peer``'s key run the receiver, from its addresses only."""
    bad = [v for v in [root, python, peer] if not v or UNSAFE & set(v)]
    if bad or len(pubkey.split()) < 2 or not sources:
        raise ValueError(f"cannot write a safe authorized_keys entry for {bad or peer!r}")
    addrs = [str(ipaddress.ip_address(a)) for a in sources]  # ValueError for a host name
    key = " ".join(pubkey.split()[:2])
    receiver = os.path.join(relay_dir(root), RECEIVER)
    return (f'restrict,from="{",".join(addrs)}",command="{python} -I {receiver}" {key} '
            f"{MARK}{root} {peer}")


def owner(line: str, root: str) -> str | None:
    """The peer a line of this lab folder is for ("" for a line from before one key per node), else None."""
    words = line.split()
    if words and words[-1] == f"{MARK}{root}":
        return ""
    if len(words) >= 2 and words[-2] == f"{MARK}{root}":
        return words[-1]
    return None


def updated(text: str, root: str, lines: dict[str, str], keep: set[str]) -> str:
    """``text`` with this lab folder's lines replaced by ``lines`` ({peer: line}), each where it was (a new
    one at the end); the lines of the peers in ``keep`` stay, every other line of this lab folder goes."""
    out, seen = [], set()
    for line in text.splitlines():
        peer = owner(line, root)
        if peer is None:
            out.append(line)
        elif peer and peer not in seen and (peer in lines or peer in keep):
            out.append(lines.get(peer, line))
            seen.add(peer)
    out += [lines[p] for p in sorted(lines) if p not in seen]
    return "".join(ln + "\n" for ln in out)


def write(path: str, text: str, mode: int = 0o600) -> None:
    """Atomically, keeping an existing file's mode; a symlinked file keeps its link (the target changes)."""
    path = os.path.realpath(path)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else mode
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def place(path: str, text: str, mode: int, check: bool) -> bool:
    """Write ``path`` unless it holds ``text``; True when it would change."""
    if read(path) == text and os.stat(path).st_mode & 0o777 == mode:
        return False
    if not check:
        if os.path.exists(path):
            os.chmod(path, mode)
        write(path, text, mode)
    return True


def set_lines(spec: dict, lines: dict[str, str], keep: set[str]) -> bool:
    path = os.path.expanduser(spec.get("authorized_keys") or "~/.ssh/authorized_keys")
    before = read(path)
    after = updated(before or "", spec["root"], lines, keep)
    changed = after != (before or "") and not (before is None and not lines)
    if changed and not spec.get("check"):
        write(path, after)
    return changed


def empty_staging(root: str, check: bool, remove: bool = False) -> bool:
    """Delete what is in the staging folder (the folder too with ``remove``); True when anything was."""
    staging = os.path.join(relay_dir(root), STAGING)
    if not os.path.lexists(staging):
        return False
    inside = os.listdir(staging) if os.path.isdir(staging) and not os.path.islink(staging) else ["?"]
    if not inside and not remove:
        return False
    if not check:
        if os.path.islink(staging) or not os.path.isdir(staging):
            os.unlink(staging)
        elif remove:
            shutil.rmtree(staging)
        else:
            for name in inside:
                path = os.path.join(staging, name)
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    return True


def keys(spec: dict) -> dict:
    """This node's key pair (made once), its public key, rsync's path, its SSH server's host key."""
    folder, check, changed = relay_dir(spec["root"]), bool(spec.get("check")), False
    key = os.path.join(folder, KEY)
    # A key without its .pub is the lab key every node had before one key per node: made anew here.
    if not os.path.exists(key + ".pub"):
        changed = True
        if not check:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            for old in (key, key + ".pub"):
                if os.path.lexists(old):
                    os.unlink(old)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{MARK}{spec['root']}",
                            "-f", key], check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    pubkey = (read(key + ".pub") or "").strip()
    port = str(int(spec.get("port") or 22))
    scan = subprocess.run(["ssh-keyscan", "-T", str(KEYSCAN_TIMEOUT_S), "-p", port, str(spec["addr"])],
                          capture_output=True, text=True)
    host_keys = [ln for ln in scan.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    return {"changed": changed, "pubkey": pubkey, "rsync": shutil.which("rsync") or "",
            "host_keys": host_keys}


def present(spec: dict) -> dict:
    """The peers' lines, the lab's known_hosts, the receiver and its staging folder."""
    root, check, me = spec["root"], bool(spec.get("check")), spec["name"]
    folder = relay_dir(root)
    peers = [p for p in spec.get("peers") or [] if p["name"] != me]
    lines = {p["name"]: entry(sys.executable, root, p["name"], p["pubkey"], p["from"])
             for p in peers if p.get("pubkey")}
    keep = set(spec.get("inventory") or []) - {p["name"] for p in peers} - {me}
    changed = False
    if not os.path.isdir(folder) or not os.path.isdir(os.path.join(folder, STAGING)):
        changed = True
        if not check:
            os.makedirs(os.path.join(folder, STAGING), mode=0o700, exist_ok=True)
            os.chmod(folder, 0o700)
    changed |= place(os.path.join(folder, KNOWN_HOSTS), spec.get("known_hosts") or "", 0o644, check)
    changed |= place(os.path.join(folder, RECEIVER), spec["receiver"], 0o644, check)
    changed |= set_lines(spec, lines, keep)
    return {"changed": changed}


def absent(spec: dict) -> dict:
    """No line of this lab folder; the staging folder empty."""
    check = bool(spec.get("check"))
    changed = set_lines(spec, {}, set())
    changed |= empty_staging(spec["root"], check)
    return {"changed": changed}


def forget(spec: dict) -> dict:
    """``absent``, then what the relay placed in .relay/, and the folder when nothing else is in it."""
    check, folder = bool(spec.get("check")), relay_dir(spec["root"])
    changed = set_lines(spec, {}, set())
    changed |= empty_staging(spec["root"], check, remove=True)
    for name in PLACED:
        path = os.path.join(folder, name)
        if os.path.lexists(path):
            changed = True
            if not check:
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    if os.path.isdir(folder) and not os.path.islink(folder) and not os.listdir(folder):
        changed = True
        if not check:
            os.rmdir(folder)
    return {"changed": changed}


STATES = {"keys": keys, "present": present, "absent": absent, "forget": forget}


if __name__ == "__main__":
    try:
        request = json.loads(sys.stdin.read())
        print(json.dumps(STATES[request["state"]](request)))
    except (ValueError, KeyError, OSError, subprocess.CalledProcessError) as e:
        sys.stderr.write(f"ddplab: error: relay access on this node: {e}\n")
        sys.exit(2)
