"""The files of one simulated host, rendered into its folder `<state>/hosts/<name>/`:

- `init.sh`: PID 1 of the host. Makes the host's private view (hostname, /tmp, /run, /dev/shm,
  /etc/hosts, /etc/hostname, /etc/ufw, /etc/default/ufw, /var/lib/ddplab, home), starts sshd, then reaps
  orphans.
- `sshd_config`, `ssh_host_ed25519_key`, `authorized_keys`, `sshd.log`.
- `etc/` (the private /etc files), `var-lib-ddplab/` (root's ddplab folder) and `home/` (the private home
  directory, see below).

Private home: the host's `$HOME` (root's home, /root) is a per-host folder bind-mounted over it,
so `~/ddplab` (the lab folder), `~/.ssh`, `~/.ansible`, shell history are all per host and the real
/root is untouched. The directories of the real home that hold the Python simlan runs with (the
venv's base interpreter, e.g. /root/.pyenv) and the repository, if it lives in the home, are
bind-mounted back into the private home at the same path, so that the repo's `.venv/bin/python`
(Ansible's interpreter on the hosts) keeps working. Everything else in the real home is hidden. A
checkout under /tmp (private in each host too) is kept visible the same way.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

# The end of every host's init.sh (root and stock hosts): start sshd, then reap orphans forever.
SSHD_AND_REAP = r"""/usr/sbin/sshd -t -f "$SSHD_CONFIG"
# Job control on: background jobs then keep SIGINT/SIGQUIT at their defaults (bash ignores them in
# background jobs otherwise, and sshd would pass that on to every login).
set -m
/usr/sbin/sshd -D -e -f "$SSHD_CONFIG" >>"$SSHD_LOG" 2>&1 </dev/null &
say "up: $(hostname) eth0=$ADDR sshd pid $!"

# PID 1 reaps every orphan of the host: bash's SIGCHLD handling collects any child, adopted
# ones included, while it waits. PID 1 ignores signals from inside the host; `simlan down`
# and `simlan kill-host` SIGKILL it from the root namespace, which ends every process here.
set +e
while :; do
  sleep 3600 &
  wait
done
"""

# Runs as PID 1 under `unshare --mount --pid --uts --fork --mount-proc --propagation private`
# inside the host's network namespace. Variables are rendered above this body.
INIT_BODY = r"""
set -euo pipefail
say() { printf 'simlan-init[%s]: %s\n' "$SIMLAN_HOST" "$*"; }

# Identity and per-namespace network settings.
printf '%s' "$SIMLAN_HOST" > /proc/sys/kernel/hostname
printf '%s\n' "$SYN_RETRIES" > /proc/sys/net/ipv4/tcp_syn_retries

# Private home, with the Python installs (and the repo) bound back at their real paths.
for keep in "${KEEP[@]}"; do
  rel=${keep#"$REAL_HOME"/}
  if [ -d "$keep" ]; then mkdir -p "$HOST_DIR/home/$rel"; else touch "$HOST_DIR/home/$rel"; fi
  mount --bind "$keep" "$HOST_DIR/home/$rel"
done
mount --rbind "$HOST_DIR/home" "$REAL_HOME"

# Private /etc files. Bind-mounted files must be edited in place (cat >), not replaced (sed -i).
mount --bind "$HOST_DIR/etc/hosts" /etc/hosts
mount --bind "$HOST_DIR/etc/hostname" /etc/hostname
mount --bind "$HOST_DIR/etc/ufw" /etc/ufw
if [ -e /etc/default/ufw ]; then mount --bind "$HOST_DIR/etc/default-ufw" /etc/default/ufw; fi
# Root's ddplab folder (roles/firewall's records of the labs on the node), private as on a real machine: the
# labs of parallel test workers name their nodes alike, and one lab's prepare took another's records for its
# own old ones and removed them.
mkdir -p /var/lib/ddplab
mount --bind "$HOST_DIR/var-lib-ddplab" /var/lib/ddplab

# Private tmpfs for /tmp, /dev/shm and /run; the host's own state folder stays visible in /run
# (sshd reads authorized_keys from it at every login).
# A checkout (and its venv) under /tmp stays visible: parked in the host folder, moved back onto the
# private /tmp.
i=0
for keep in "${KEEP_TMP[@]}"; do
  mkdir -p "$HOST_DIR/tmp-keep/$i"
  mount --bind "$keep" "$HOST_DIR/tmp-keep/$i"
  i=$((i + 1))
done
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
i=0
for keep in "${KEEP_TMP[@]}"; do
  mkdir -p "$keep"
  mount --move "$HOST_DIR/tmp-keep/$i" "$keep"
  i=$((i + 1))
done
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
if [[ "$HOST_DIR/" == /run/* ]]; then
  parked=/tmp/.simlan-host-dir
  mkdir "$parked"
  mount --bind "$HOST_DIR" "$parked"
  mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
  mkdir -p "$HOST_DIR"
  mount --move "$parked" "$HOST_DIR"
  rmdir "$parked"
else
  mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
fi
mkdir -p -m 755 /run/sshd
mkdir -p -m 1777 /run/lock

# A --mem-limit host sees the machine's memory cgroup file system, read-only, where a real machine has it
# (`ip netns exec` mounted a fresh /sys without it): a node's probe reads its own limit there.
if [ -n "$CGROUP_FS" ]; then
  read -r fs opts dir <<< "$CGROUP_FS"
  if [ "$dir" != /sys/fs/cgroup ]; then mount -t tmpfs -o mode=755,nosuid,nodev cgroup /sys/fs/cgroup; fi
  mkdir -p "$dir"
  mount -t "$fs" -o "$opts" cgroup "$dir"
  mount -o remount,bind,ro "$dir"  # this mount only: the machine's own stays writable
fi

""" + SSHD_AND_REAP


def render_init(*, host: str, addr: str, host_dir: Path, real_home: str, keep: list[str],
                syn_retries: int, keep_tmp: list[str] | None = None, cgroup_fs: str = "") -> str:
    values = {
        "SIMLAN_HOST": host,
        "ADDR": addr,
        "HOST_DIR": str(host_dir),
        "REAL_HOME": real_home,
        "SSHD_CONFIG": str(host_dir / "sshd_config"),
        "SSHD_LOG": str(host_dir / "sshd.log"),
        "SYN_RETRIES": str(syn_retries),
        "CGROUP_FS": cgroup_fs,  # "TYPE OPTIONS MOUNTPOINT" of the memory cgroup (simlan.memlimit), or ""
    }
    header = "\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items())
    keep_line = "KEEP=(" + " ".join(shlex.quote(k) for k in keep) + ")"
    keep_tmp_line = "KEEP_TMP=(" + " ".join(shlex.quote(k) for k in keep_tmp or []) + ")"
    return (
        "#!/bin/bash\n"
        f"# PID 1 of simulated host {host}. Rendered by simlan (simlan/hostinit.py); do not edit.\n"
        f"{header}\n{keep_line}\n{keep_tmp_line}\n{INIT_BODY}"
    )


def render_sshd_config(*, addr: str, host_dir: Path) -> str:
    return f"""\
# sshd of a simulated host, rendered by simlan. Started as `/usr/sbin/sshd -D -e -f` this file.
ListenAddress {addr}:22
HostKey {host_dir}/ssh_host_ed25519_key
PidFile none
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
# The state folder is not root-only at every level; keys there would otherwise be refused.
StrictModes no
# The cluster key, then the user's own file as on a real host (ddplab's relay entry goes there).
AuthorizedKeysFile {host_dir}/authorized_keys .ssh/authorized_keys
Subsystem sftp internal-sftp
PrintMotd no
AcceptEnv LANG LC_*
# Ansible opens several connections at once.
MaxStartups 100:30:200
MaxSessions 50
"""


def render_etc_hosts(hosts: list[tuple[str, str]]) -> str:
    lines = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "# simlan hosts. The host's own name is deliberately NOT on loopback: gloo resolves it.",
    ]
    lines += [f"{addr}\t{name}" for name, addr in hosts]
    return "\n".join(lines) + "\n"


def write_host_files(*, host: str, addr: str, host_dir: Path, all_hosts: list[tuple[str, str]],
                     client_pubkey: str, real_home: str, keep: list[str], syn_retries: int,
                     ssh_keygen: str, keep_tmp: list[str] | None = None, cgroup_fs: str = "") -> None:
    """Create the host's folder with everything init.sh needs (private /etc, home, sshd files)."""
    from simlan.system import run

    etc = host_dir / "etc"
    etc.mkdir(parents=True)
    (etc / "hosts").write_text(render_etc_hosts(all_hosts))
    (etc / "hostname").write_text(host + "\n")
    # A private copy of the real ufw configuration; enabling ufw in a host touches only that host.
    shutil.copytree("/etc/ufw", etc / "ufw", symlinks=True)
    if Path("/etc/default/ufw").exists():
        shutil.copy2("/etc/default/ufw", etc / "default-ufw")
    (host_dir / "var-lib-ddplab").mkdir(mode=0o755)

    home = host_dir / "home"
    home.mkdir(mode=0o700)
    for skel in (".bashrc", ".profile"):
        if Path("/etc/skel", skel).exists():
            shutil.copy2(Path("/etc/skel", skel), home / skel)
    (home / ".ssh").mkdir(mode=0o700)

    run([ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host}",
         "-f", str(host_dir / "ssh_host_ed25519_key")], what=f"{host}: ssh-keygen (host key)")
    (host_dir / "authorized_keys").write_text(client_pubkey)
    (host_dir / "sshd_config").write_text(render_sshd_config(addr=addr, host_dir=host_dir))
    (host_dir / "sshd.log").touch()
    init = host_dir / "init.sh"
    init.write_text(render_init(host=host, addr=addr, host_dir=host_dir, real_home=real_home,
                                keep=keep, syn_retries=syn_retries, keep_tmp=keep_tmp or [],
                                cgroup_fs=cgroup_fs))
    init.chmod(0o755)
