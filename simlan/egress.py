"""Package traffic for stock hosts: the only way out of the simulated LAN.

This machine reaches the Debian mirror and PyPI directly (no proxy in the environment or in apt's
configuration), through its resolver. Stock hosts get a default route via the bridge, and the real
machine forwards and masquerades (NAT) from the lab's subnet only:
- TCP 80 and 443 to the IPv4 addresses the package registries resolve to at `up` (the Debian mirrors
  in this machine's apt sources, deb.debian.org, security.debian.org, pypi.org, files.pythonhosted.org);
- UDP and TCP 53 to this machine's nameservers (/etc/resolv.conf), so the hosts can resolve those names.
Anything else that would leave the bridge is dropped. The rules live in two chains of their own,
`SIMLAN<lab>-FWD` (filter, jumped to first from FORWARD) and `SIMLAN<lab>-NAT` (nat, from
POSTROUTING); `remove` deletes both jumps and both chains, and puts net.ipv4.ip_forward back if
simlan turned it on and no other lab's chain is left.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from simlan import network, rootfs
from simlan.errors import SimlanError
from simlan.system import run, which

REGISTRY_NAMES = ("deb.debian.org", "security.debian.org", "pypi.org", "files.pythonhosted.org")
WEB_PORTS = "80,443"
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")


def fwd_chain() -> str:
    return f"SIMLAN{network.LAB}-FWD"


def nat_chain() -> str:
    return f"SIMLAN{network.LAB}-NAT"


def subnet() -> str:
    return f"10.77.{network.LAB}.0/{network.PREFIX_LEN}"


def proxy_in_use() -> str | None:
    """A proxy the registries would be reached through (environment or apt), or None."""
    for var in PROXY_VARS:
        if os.environ.get(var):
            return f"${var}={os.environ[var]}"
    apt_config = which("apt-config")
    if apt_config:
        dump = subprocess.run([apt_config, "dump"], capture_output=True, text=True, timeout=30).stdout
        for line in dump.splitlines():
            if re.match(r'Acquire::https?::Proxy(::[^ ]+)? "(?!DIRECT|false)[^"]+"', line):
                return line
    return None


def nameservers(resolv_conf: str) -> list[str]:
    found = []
    for line in resolv_conf.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            found.append(words[1])
    return found


def resolve(names: list[str]) -> list[str]:
    addrs: set[str] = set()
    for name in names:
        try:
            infos = socket.getaddrinfo(name, 443, socket.AF_INET, socket.SOCK_STREAM)
        except OSError as exc:
            raise SimlanError(f"--stock: cannot resolve package registry {name} ({exc}); stock hosts "
                              "install packages from it; check this machine's DNS") from exc
        addrs.update(info[4][0] for info in infos)
    return sorted(addrs, key=ipaddress.IPv4Address)


def plan(resolv_conf: str) -> dict:
    """What will be allowed: {"registries": [names], "web": [IPv4], "dns": [IPv4]}."""
    proxy = proxy_in_use()
    if proxy:
        raise SimlanError(f"--stock: the package registries are reached through a proxy ({proxy}); "
                          "simlan's stock hosts support direct access only; unset the proxy or run "
                          "without --stock", code=2)
    main, security = rootfs.debian_mirrors()
    names = sorted({urlsplit(u).hostname for u in (main, security) if u} | set(REGISTRY_NAMES))
    dns = nameservers(resolv_conf)
    for ns in dns:
        if ipaddress.ip_address(ns).is_loopback:
            raise SimlanError(f"/etc/resolv.conf: nameserver {ns} is on loopback, which stock hosts "
                              "cannot reach; allowed: a nameserver on the network (e.g. the one "
                              "systemd-resolved forwards to)", code=2)
    dns = [ns for ns in dns if ipaddress.ip_address(ns).version == 4]
    return {"registries": names, "web": resolve(names), "dns": dns}


def rules(allowed: dict) -> tuple[list[list[str]], list[list[str]]]:
    """(filter rules of the FWD chain, nat rules of the NAT chain), as iptables argument lists."""
    bridge, src = network.BRIDGE, subnet()
    fwd = [["-i", bridge, "-o", bridge, "-j", "RETURN"]]  # traffic between the hosts: untouched
    fwd.append(["-o", bridge, "-d", src, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                "-j", "ACCEPT"])
    nat = []
    for dst in allowed["web"]:
        match = ["-s", src, "-d", f"{dst}/32", "-p", "tcp", "-m", "multiport", "--dports", WEB_PORTS]
        fwd.append(["-i", bridge, *match, "-j", "ACCEPT"])
        nat.append([*match, "-j", "MASQUERADE"])
    for dst in allowed["dns"]:
        for proto in ("udp", "tcp"):
            match = ["-s", src, "-d", f"{dst}/32", "-p", proto, "--dport", "53"]
            fwd.append(["-i", bridge, *match, "-j", "ACCEPT"])
            nat.append([*match, "-j", "MASQUERADE"])
    fwd.append(["-i", bridge, "-j", "DROP"])  # anything else leaving the lab
    fwd.append(["-o", bridge, "-j", "DROP"])  # anything else entering it from outside
    return fwd, nat


def _iptables() -> str:
    path = which("iptables")
    if path is None:
        raise SimlanError("--stock: missing `iptables` (package traffic of stock hosts is NATed); "
                          "install the Debian package: apt-get install -y iptables", code=2)
    return path


def add(allowed: dict) -> dict:
    """Install the chains and turn on forwarding; return what to undo (recorded in cluster.json)."""
    ipt = _iptables()
    record = {"fwd_chain": fwd_chain(), "nat_chain": nat_chain(),
              "forward_was": IP_FORWARD.read_text().strip(), "allowed": allowed}
    _remove_chains(ipt)  # a leftover of a crashed run of this lab
    fwd, nat = rules(allowed)
    try:
        run([ipt, "-w", "-N", fwd_chain()])
        for rule in fwd:
            run([ipt, "-w", "-A", fwd_chain(), *rule])
        run([ipt, "-w", "-t", "nat", "-N", nat_chain()])
        for rule in nat:
            run([ipt, "-w", "-t", "nat", "-A", nat_chain(), *rule])
        run([ipt, "-w", "-I", "FORWARD", "1", "-j", fwd_chain()])
        run([ipt, "-w", "-t", "nat", "-I", "POSTROUTING", "1", "-j", nat_chain()])
        if record["forward_was"] != "1":
            IP_FORWARD.write_text("1\n")
    except BaseException:
        remove(record)  # nothing half-made stays
        raise
    return record


def _remove_chains(ipt: str) -> None:
    for table, parent, chain in (("filter", "FORWARD", fwd_chain()), ("nat", "POSTROUTING", nat_chain())):
        while run([ipt, "-w", "-t", table, "-D", parent, "-j", chain], check=False).returncode == 0:
            pass
        run([ipt, "-w", "-t", table, "-F", chain], check=False)
        run([ipt, "-w", "-t", table, "-X", chain], check=False)


def remove(record: dict | None) -> None:
    """Undo `add`: both chains and their jumps; ip_forward back to what it was if no lab uses it."""
    if not record:
        return
    ipt = _iptables()
    _remove_chains(ipt)
    others = re.findall(r"^-N SIMLAN\d+-FWD$", run([ipt, "-w", "-S"]).stdout, flags=re.M)
    if record.get("forward_was") == "0" and not others:
        IP_FORWARD.write_text("0\n")


def route_default(ip: str, ns: str) -> None:
    """Give a stock host the bridge as its default gateway."""
    run([ip, "-n", ns, "route", "replace", "default", "via", network.GATEWAY, "dev", "eth0"])


def describe(record: dict) -> list[str]:
    """The rules as iptables -S lines (README, report, status)."""
    fwd, nat = rules(record["allowed"])
    return ([f"-A {record['fwd_chain']} {' '.join(r)}" for r in fwd]
            + [f"-t nat -A {record['nat_chain']} {' '.join(r)}" for r in nat])
