"""The files of one stock host (`up --stock`), rendered into `<state>/hosts/<name>/`:

- `init.sh`: PID 1. Mounts the host's overlay root (lower: the cached Debian 12 tree from
  simlan.rootfs, read-only and shared; `upper/` and `work/`: this host's own changes), mounts
  /proc, /sys (read-only: the kernel's sysfs is the real machine's, bar the network part), /dev
  (a tmpfs with the usual nodes, its own devpts for terminals, /dev/shm), /run and /tmp, then
  pivot_roots into it. On first boot, as an installer would: hostname, /etc/hosts, resolv.conf,
  a login user `lab` (group sudo, a password; sudo asks for it), its authorized key, an ed25519
  host key, `PermitRootLogin no`. Then it starts the stock sshd and reaps orphans.
- `hosts`, `hostname`, `resolv.conf`, `authorized_keys`, `lab-password` (0600): read by init.sh
  before the pivot. Everything the host writes lands in `upper/` and goes with `down`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from simlan.hostinit import SSHD_AND_REAP

LOGIN_USER = "lab"
SSHD_CONFIG = "/etc/ssh/sshd_config"  # inside the host
SSHD_LOG = "/var/log/sshd.log"  # inside the host; seen from outside in upper/var/log/sshd.log

INIT_BODY = r"""
set -euo pipefail
say() { printf 'simlan-init[%s]: %s\n' "$SIMLAN_HOST" "$*"; }

printf '%s' "$SIMLAN_HOST" > /proc/sys/kernel/hostname
printf '%s\n' "$SYN_RETRIES" > /proc/sys/net/ipv4/tcp_syn_retries
LAB_PASSWORD=$(cat "$HOST_DIR/lab-password")
PUBKEY=$(cat "$HOST_DIR/authorized_keys")

R=$HOST_DIR/root
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$HOST_DIR/upper,workdir=$HOST_DIR/work" "$R"

# Kernel filesystems and the usual /dev, as on a booted system.
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
mount -t tmpfs -o mode=755,nosuid,size=1m tmpfs "$R/dev"
mknod -m 666 "$R/dev/null" c 1 3
mknod -m 666 "$R/dev/zero" c 1 5
mknod -m 666 "$R/dev/full" c 1 7
mknod -m 666 "$R/dev/random" c 1 8
mknod -m 666 "$R/dev/urandom" c 1 9
mknod -m 666 "$R/dev/tty" c 5 0
mkdir -m 755 "$R/dev/pts"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mkdir -m 1777 "$R/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$R/run"
mkdir -m 1777 "$R/run/lock"
mkdir -m 755 "$R/run/sshd"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"

# Identity, written through the overlay (so into upper/), as the installer and DHCP would.
cat "$HOST_DIR/hosts" > "$R/etc/hosts"
cat "$HOST_DIR/hostname" > "$R/etc/hostname"
cat "$HOST_DIR/resolv.conf" > "$R/etc/resolv.conf"

# Into the host's own root; the old root (and with it the real machine's files) goes away.
cd "$R"
pivot_root . mnt
cd /
umount -l /mnt
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# First boot, with the stock system's own tools. A host switched on again (simlan revive-host) keeps
# its user, password and host key, as a machine that reboots.
if ! id "$LOGIN_USER" >/dev/null 2>&1; then
  useradd --create-home --shell /bin/bash --groups sudo "$LOGIN_USER"
  printf '%s:%s\n' "$LOGIN_USER" "$LAB_PASSWORD" | chpasswd
  install -d -m 700 -o "$LOGIN_USER" -g "$LOGIN_USER" "/home/$LOGIN_USER/.ssh"
  printf '%s\n' "$PUBKEY" > "/home/$LOGIN_USER/.ssh/authorized_keys"
  chown "$LOGIN_USER:$LOGIN_USER" "/home/$LOGIN_USER/.ssh/authorized_keys"
  chmod 600 "/home/$LOGIN_USER/.ssh/authorized_keys"
  ssh-keygen -q -t ed25519 -N '' -C "root@$SIMLAN_HOST" -f /etc/ssh/ssh_host_ed25519_key
  cat > /etc/ssh/sshd_config.d/simlan.conf <<'EOF'
# simlan stock host: one host key, made at first boot; root may not log in.
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin no
EOF
fi
unset LAB_PASSWORD

""" + SSHD_AND_REAP


def render_init(*, host: str, addr: str, host_dir: Path, lower: Path, syn_retries: int) -> str:
    values = {
        "SIMLAN_HOST": host,
        "ADDR": addr,
        "HOST_DIR": str(host_dir),
        "LOWER": str(lower),
        "LOGIN_USER": LOGIN_USER,
        "SSHD_CONFIG": SSHD_CONFIG,
        "SSHD_LOG": SSHD_LOG,
        "SYN_RETRIES": str(syn_retries),
    }
    header = "\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items())
    return (
        "#!/bin/bash\n"
        f"# PID 1 of simulated stock host {host}. Rendered by simlan (simlan/stockinit.py); do not edit.\n"
        f"{header}\n{INIT_BODY}"
    )


def render_etc_hosts(host: str, hosts: list[tuple[str, str]]) -> str:
    """/etc/hosts as the Debian installer writes it (the hostname on 127.0.1.1), plus the LAN names."""
    lines = [
        "127.0.0.1\tlocalhost",
        f"127.0.1.1\t{host}",
        "",
        "# The following lines are desirable for IPv6 capable hosts",
        "::1     localhost ip6-localhost ip6-loopback",
        "ff02::1 ip6-allnodes",
        "ff02::2 ip6-allrouters",
        "",
        "# simlan hosts",
    ]
    lines += [f"{addr}\t{name}" for name, addr in hosts]
    return "\n".join(lines) + "\n"


def _private(path: Path, text: str) -> None:
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)


def write_stock_host_files(*, host: str, addr: str, host_dir: Path, all_hosts: list[tuple[str, str]],
                           client_pubkey: str, password: str, lower: Path, resolv_conf: str,
                           syn_retries: int) -> None:
    """Create the host's folder: overlay dirs, the files init.sh reads, and init.sh itself."""
    for sub in ("upper", "work", "root"):
        (host_dir / sub).mkdir(parents=True, mode=0o755)
    (host_dir / "hosts").write_text(render_etc_hosts(host, all_hosts))
    (host_dir / "hostname").write_text(host + "\n")
    (host_dir / "resolv.conf").write_text(resolv_conf)
    (host_dir / "authorized_keys").write_text(client_pubkey)
    _private(host_dir / "lab-password", password)
    init = host_dir / "init.sh"
    init.write_text(render_init(host=host, addr=addr, host_dir=host_dir, lower=lower,
                                syn_retries=syn_retries))
    init.chmod(0o700)
