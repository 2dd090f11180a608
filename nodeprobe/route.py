"""``python -m nodeprobe route --master ADDR``: the interface and source address this node uses toward
the master, and what its hostname resolves to, as one JSON object (for roles/gloo_network).

Read-only; uses `ip -j` and getent only.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess


def ip_json(*args):
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return None, out.stderr.strip()
    return json.loads(out.stdout or "[]"), ""


def route(master: str) -> dict:
    res = {"master": master, "iface": "", "src": "", "prefixlen": None, "ipv4": False,
           "same_subnet": False, "hostname": socket.gethostname(), "hostname_addrs": [],
           "hostname_loopback": False, "error": ""}
    try:
        addr = ipaddress.ip_address(master)
    except ValueError:
        res["error"] = f"master address {master!r} is not an IP address"
        return res
    res["ipv4"] = addr.version == 4
    routes, err = ip_json("route", "get", master)
    if not routes:
        res["error"] = f"no route to {master}: {err}"
        return res
    route = routes[0]
    iface, src = route.get("dev", ""), route.get("prefsrc", "")
    if route.get("type") == "local" and not addr.is_loopback:
        # The master's own address routes through lo: use the interface that holds it.
        held, _ = ip_json("-4", "addr", "show", "to", f"{master}/32")
        if held:
            iface, src = held[0]["ifname"], master
    res["iface"], res["src"] = iface, src
    info, _ = ip_json("-4", "addr", "show", "dev", iface) if iface else (None, "")
    for entry in (info or [{}])[0].get("addr_info", []):
        if entry.get("local") == src:
            res["prefixlen"] = entry.get("prefixlen")
    if res["prefixlen"] is not None and res["ipv4"]:
        net = ipaddress.ip_network(f"{src}/{res['prefixlen']}", strict=False)
        res["same_subnet"] = addr in net
    out = subprocess.run(["getent", "ahosts", res["hostname"]], capture_output=True, text=True, check=False)
    addrs = sorted({line.split()[0] for line in out.stdout.splitlines() if line.strip()})
    res["hostname_addrs"] = addrs
    res["hostname_loopback"] = any(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)
    return res
