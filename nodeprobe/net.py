"""Network probes: ``listen``, ``connect``, ``resolve``, ``iface`` (stdlib only, short timeouts).

``listen`` answers each connection with one line ``nodeprobe <hostname> <port>\\n`` so that
``connect`` can tell our listener from some other process that happens to accept on the port.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import re
import select
import socket
import subprocess
import time

BANNER = b"nodeprobe"
CMD_TIMEOUT = 5


def _banner(port: int) -> bytes:
    return BANNER + b" " + socket.gethostname().encode() + b" " + str(port).encode() + b"\n"


def _serve(srv: socket.socket, seconds: float, max_conns: int | None = None) -> int:
    """Accept and answer until ``seconds`` pass; a client sending ``quit`` ends it early, and so does
    the ``max_conns``-th connection (the preflight knows how many peers will knock)."""
    port = srv.getsockname()[1]
    deadline = time.monotonic() + seconds
    served = 0
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([srv], [], [], min(left, 0.5))
        if not ready:
            continue
        try:
            conn, _ = srv.accept()
        except OSError:
            continue
        served += 1
        with conn:
            conn.settimeout(0.5)
            try:
                conn.sendall(_banner(port))
                msg = conn.recv(16)
            except OSError:
                msg = b""
            if msg.strip() == b"quit":
                break
        if max_conns is not None and served >= max_conns:
            break
    return served


def listen(port: int, seconds: float, background: bool, bind: str = "0.0.0.0",
           max_conns: int | None = None) -> dict | None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((bind, port))
        srv.listen(64)
    except OSError as e:
        srv.close()
        return {"probe": "listen", "host": socket.gethostname(), "ok": False, "port": port,
                "errno": errno.errorcode.get(e.errno, str(e.errno)), "error": str(e)}
    real_port = srv.getsockname()[1]
    head = {"probe": "listen", "host": socket.gethostname(), "ok": True, "port": real_port,
            "bind": bind, "seconds": seconds, "max_conns": max_conns}
    if background:
        # Detach: the parent prints the port and returns at once (an Ansible task does not wait);
        # the child keeps serving for `seconds`, in its own session so a closing SSH cannot stop it.
        if not detach():
            srv.close()
            return head
        _serve(srv, seconds, max_conns)
        os._exit(0)
    head["pid"] = os.getpid()
    print(json.dumps(head), flush=True)
    _serve(srv, seconds, max_conns)
    srv.close()
    return None  # the one JSON object was printed before serving


def classify(err: OSError | None, timed_out: bool) -> str:
    if timed_out:
        return "timeout"
    code = err.errno if err is not None else None
    return {
        errno.ECONNREFUSED: "refused",
        errno.EHOSTUNREACH: "unreachable",
        errno.ENETUNREACH: "unreachable",
        errno.ETIMEDOUT: "timeout",
        errno.ECONNRESET: "reset",
        errno.EADDRNOTAVAIL: "unreachable",
    }.get(code, "error")


def connect(host: str, port: int, timeout: float, send_quit: bool = False) -> dict:
    out = {"probe": "connect", "from": socket.gethostname(), "host": host, "port": port,
           "timeout_s": timeout}
    start = time.monotonic()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        out.update(ok=False, result="unresolved", error=str(e), elapsed_s=round(time.monotonic() - start, 3))
        return out
    family, _, _, _, addr = infos[0]
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(addr)
    except TimeoutError:
        out.update(ok=False, result="timeout", errno="ETIMEDOUT",
                   error=f"no answer within {timeout} s (packets dropped: firewall?)")
    except OSError as e:
        out.update(ok=False, result=classify(e, False), errno=errno.errorcode.get(e.errno, str(e.errno)),
                   error=e.strerror or str(e))
    else:
        out.update(ok=True, result="connected", local=s.getsockname()[0])
        try:
            s.settimeout(max(0.5, timeout - (time.monotonic() - start)))
            banner = s.recv(256)
            out["banner"] = banner.decode(errors="replace").strip()
            out["nodeprobe_listener"] = banner.startswith(BANNER)
            if send_quit:
                s.sendall(b"quit\n")
        except OSError:
            out["banner"] = None
            out["nodeprobe_listener"] = False
    finally:
        s.close()
    out["address"] = addr[0]
    out["elapsed_s"] = round(time.monotonic() - start, 3)
    return out


def connect_many(targets: list[str], timeout: float) -> dict:
    """``NAME=HOST:PORT`` targets, tried concurrently (threads), so N peers cost one timeout."""
    from concurrent.futures import ThreadPoolExecutor

    parsed = []
    for t in targets:
        name, _, hp = t.rpartition("=")
        host, _, port = hp.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad --target {t!r}: expected NAME=HOST:PORT")
        parsed.append((name or host, host.strip("[]"), int(port)))
    with ThreadPoolExecutor(max_workers=max(1, len(parsed))) as pool:
        results = list(pool.map(lambda p: connect(p[1], p[2], timeout), parsed))
    return {"probe": "connect", "from": socket.gethostname(),
            "targets": {p[0]: r for p, r in zip(parsed, results, strict=True)}}


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def _ip_json(*args: str) -> list:
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout or "[]")


def interfaces() -> list[dict]:
    result = []
    for link in _ip_json("addr", "show"):
        addrs = [
            {"family": "ipv6" if a.get("family") == "inet6" else "ipv4",
             "address": a.get("local"), "prefixlen": a.get("prefixlen"), "scope": a.get("scope")}
            for a in link.get("addr_info", [])
        ]
        result.append({
            "name": link.get("ifname"),
            "state": link.get("operstate"),
            "loopback": "LOOPBACK" in link.get("flags", []),
            "families": sorted({a["family"] for a in addrs}),
            "addresses": addrs,
        })
    return result


def resolve() -> dict:
    name = socket.gethostname()
    out = {"probe": "resolve", "host": name, "hostname": name, "fqdn": socket.getfqdn()}
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        out.update(resolves=False, error=str(e), addresses=[], any_loopback=False, first_ipv6=False)
        return out
    addrs = []
    for family, _, _, _, sa in infos:
        entry = {"family": "ipv6" if family == socket.AF_INET6 else "ipv4", "address": sa[0]}
        if entry not in addrs:
            addrs.append(entry)
    try:
        local = {a["address"] for i in interfaces() for a in i["addresses"]}
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired):
        local = None
    out.update(
        resolves=True,
        addresses=addrs,
        first=addrs[0] if addrs else None,
        any_loopback=any(_is_loopback(a["address"]) for a in addrs),
        first_ipv6=bool(addrs) and addrs[0]["family"] == "ipv6",
        local_addresses=sorted(local) if local is not None else None,
        first_is_local=(addrs[0]["address"] in local) if (addrs and local is not None) else None,
    )
    return out


UFW_CONF = "/etc/ufw/ufw.conf"
UFW_DEFAULTS = "/etc/default/ufw"
FIREWALLD = ("/usr/sbin/firewalld", "/usr/bin/firewalld")


def firewall(conf: str = UFW_CONF, defaults: str = UFW_DEFAULTS, firewalld=FIREWALLD) -> dict:
    """Whether this node drops connections from hosts outside the lab, read without root (`ufw status` and
    `nft list` need it): ufw installed (ufw.conf), turned on (ENABLED=yes) and its default incoming policy
    (/etc/default/ufw, world-readable: ACCEPT lets everyone in whatever ddplab's rules say); firewalld
    installed and, asked over D-Bus, running (``firewalld_running`` None when it cannot be asked)."""
    out = {"probe": "firewall", "ufw": os.path.exists(conf), "ufw_enabled": None, "ufw_input_policy": None,
           "firewalld": any(os.path.exists(p) for p in firewalld), "firewalld_running": None}
    if out["ufw"]:
        with open(conf, errors="replace") as f:
            out["ufw_enabled"] = re.search(r"(?m)^\s*ENABLED\s*=\s*yes\b", f.read()) is not None
        with contextlib.suppress(OSError), open(defaults, errors="replace") as f:
            policy = re.search(r'(?m)^\s*DEFAULT_INPUT_POLICY\s*=\s*"?(\w+)', f.read())
            out["ufw_input_policy"] = policy.group(1).upper() if policy else None
    if out["firewalld"]:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            state = subprocess.run(["firewall-cmd", "--state"], capture_output=True, text=True, timeout=10)
            out["firewalld_running"] = state.stdout.strip() == "running" if state.stdout.strip() else None
    return out


def iface(master: str) -> dict:
    out = {"probe": "iface", "host": socket.gethostname(), "master": master}
    try:
        master_ip = ipaddress.ip_address(master)
    except ValueError:
        try:
            master_ip = ipaddress.ip_address(socket.getaddrinfo(master, None)[0][4][0])
        except (socket.gaierror, ValueError) as e:
            out.update(ok=False, error=f"cannot resolve master {master}: {e}")
            return out
    try:
        ifaces = interfaces()
        route = _ip_json("route", "get", str(master_ip))
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        out.update(ok=False, error=str(e))
        return out
    out["interfaces"] = ifaces
    out["family"] = f"ipv{master_ip.version}"
    r = route[0] if route else {}
    dev, src = r.get("dev"), r.get("prefsrc")
    out["route"] = {"dev": dev, "src": src, "gateway": r.get("gateway"), "type": r.get("type", "unicast")}
    owner = next((i for i in ifaces for a in i["addresses"] if a["address"] == str(master_ip)), None)
    if owner is not None and not owner["loopback"]:
        # This node IS the master: the route is via lo, gloo will use the interface holding the address.
        dev, src, out["is_master"] = owner["name"], str(master_ip), True
    else:
        out["is_master"] = False
    out["dev"], out["src"] = dev, src
    same = False
    dev_entry = next((i for i in ifaces if i["name"] == dev), None)
    if dev_entry:
        for a in dev_entry["addresses"]:
            try:
                net = ipaddress.ip_interface(f"{a['address']}/{a['prefixlen']}").network
            except ValueError:
                continue
            if master_ip in net and (src is None or a["address"] == src):
                same = True
        out["dev_families"] = dev_entry["families"]
        out["dev_loopback"] = dev_entry["loopback"]
    out["same_subnet"] = same
    out["ok"] = True
    return out


def detach() -> bool:
    """Fork a detached grandchild (own session, stdio on /dev/null). True in the grandchild."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return False
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    return True
