"""Checks of the network as gloo will use it: interface, hostname, the TCP matrix between the nodes,
the master port, leftover processes, and the gloo smoke test."""

from __future__ import annotations

from ddplab.preflight.judge import FAIL, NA, OK, SKIP, Judge


def iface(j: Judge, h: str) -> None:
    r = j.need(h, "iface", "iface")
    if not r:
        return
    dev, src, fam = r.get("dev"), r.get("src"), r.get("family")
    want = j.setting(h, "ifname")
    ipv4_devs = [i["name"] for i in r.get("interfaces", []) if "ipv4" in i.get("families", [])
                 and not i.get("loopback")]
    good = dev if dev and not r.get("dev_loopback") else (ipv4_devs[0] if ipv4_devs else "eth0")
    desc = f"{dev} (src {src} -> master {r.get('master')})"
    if fam != "ipv4":
        j.fail(h, "iface", f"the master address {r.get('master')} is {fam}: peers must share IPv4",
                  f"set ddplab_addr of the master to its IPv4 address; export GLOO_SOCKET_IFNAME={good}")
    elif r.get("dev_loopback") and not j.all_local:
        j.fail(h, "iface", f"the route to the master goes via loopback {dev}",
                  f"set the master's ddplab_addr to its LAN address; export GLOO_SOCKET_IFNAME={good}")
    elif not r.get("same_subnet"):
        j.fail(h, "iface", f"{desc}: {src} is not on the master's subnet (routed via "
                              f"{(r.get('route') or {}).get('gateway')})",
                  f"put {h} on the master's LAN, or export GLOO_SOCKET_IFNAME=<the LAN interface>")
    elif want and want != dev and not j.all_local:
        j.fail(h, "iface", f"GLOO_SOCKET_IFNAME={want} but the route to the master uses {dev}",
                  f"export GLOO_SOCKET_IFNAME={dev}")
    else:
        extra = [i["name"] for i in r.get("interfaces", []) if "ipv6" in i.get("families", [])
                 and "ipv4" not in i.get("families", []) and not i.get("loopback")]
        note = f"; IPv6-only interfaces {', '.join(extra)} (pin GLOO_SOCKET_IFNAME={dev})" \
            if extra else ""
        j.set(h, "iface", OK, f"{desc}, IPv4, same subnet{note}")


def pinned_iface(j: Judge, h: str) -> str | None:
    """The interface gloo is pinned to: ddplab exports GLOO_SOCKET_IFNAME = the route's interface toward
    the master, so when the iface check passed, gloo never resolves the hostname to pick an address."""
    r = j.probe(h, "iface") or {}
    cell = j.rows[h].get("iface") or {}
    return r.get("dev") if cell.get("status") == OK and r.get("dev") and not r.get("dev_loopback") else None


def hostname(j: Judge, h: str) -> None:
    r = j.need(h, "hostname", "resolve")
    if not r:
        return
    name = r.get("hostname")
    addr = j.addr(h)
    fix = f"fix /etc/hosts on {h} so {name} maps to {addr}"
    addrs = ", ".join(a["address"] for a in r.get("addresses", []))
    if not r.get("resolves"):
        j.fail(h, "hostname", f"hostname {name} does not resolve ({r.get('error')}): gloo falls back "
                                 "to loopback", f"add '{addr} {name}' to /etc/hosts on {h}")
    elif r.get("first_ipv6"):
        j.fail(h, "hostname", f"{name} resolves first to IPv6 {r['first']['address']} (all: {addrs}): "
                                 "gloo mixes families (ss_family 10 vs 2)",
                  f"{fix}, and export GLOO_SOCKET_IFNAME=<its IPv4 LAN interface>")
    elif r.get("any_loopback") and not j.all_local and pinned_iface(j, h):
        # a stock Debian/Ubuntu /etc/hosts line (127.0.1.1 <hostname>); measured harmless with the pin
        j.set(h, "hostname", OK, f"{name} -> {addrs}; harmless: GLOO_SOCKET_IFNAME={pinned_iface(j, h)} "
                                 "pins gloo to that interface, so the hostname is not used", note="info")
    elif r.get("any_loopback") and not j.all_local:
        j.fail(h, "hostname", f"{name} resolves to loopback ({addrs}) and gloo's interface is not pinned "
                              "(iface check failed): gloo would use loopback", fix)
    elif r.get("first_is_local") is False:
        j.fail(h, "hostname", f"{name} resolves to {addrs}, not an address of {h}", fix)
    else:
        j.set(h, "hostname", OK, f"{name} -> {addrs}")


def tcp_edges(j: Judge) -> list[dict]:
    """Every connect result as an edge src -> dst with its kind (master port or peer port)."""
    out = []
    for s in j.hosts:
        r = j.probe(s, "tcp_master")
        if r and j.master and s != j.master:
            out.append({"src": s, "dst": j.master, "kind": "tcp_master", **r})
        r = j.probe(s, "tcp_peers")
        for d, res in ((r or {}).get("targets") or {}).items():
            if d in j.hosts and d != s:
                out.append({"src": s, "dst": d, "kind": "tcp_peers", **res})
    return out


def blame(j: Judge, e: dict, edges: list[dict]) -> str:
    """Inbound firewalls are the usual cause: blame the destination, unless the source fails
    every connection it tried while someone else reached those destinations (its outbound)."""
    mine = [x for x in edges if x["src"] == e["src"]]
    if all(not x.get("ok") for x in mine) and len(mine) > 1:
        targets = {m["dst"] for m in mine}
        if any(x.get("ok") and x["src"] != e["src"] and x["dst"] in targets for x in edges):
            return e["src"]
    return e["dst"]


def describe(j: Judge, e: dict) -> str:
    how = {"timeout": f"timed out after {e.get('timeout_s')} s (packets dropped: firewall)",
           "refused": "refused (nothing listening, or a firewall rejects)",
           "unreachable": "unreachable (no route)"}.get(e.get("result"),
                                                        f"{e.get('result')}: {e.get('error')}")
    return f"{e['src']} -> {e['dst']} {e.get('address') or j.addr(e['dst'])}:{e.get('port')} {how}"


def unknown_links(j: Judge) -> dict[str, str]:
    """--limit: the left-out nodes whose links could not be tried, and why."""
    out = {}
    for h in j.left_out:
        ssh, peers = j.probe(h, "ssh") or {}, j.probe(h, "tcp_peers") or {}
        if ssh.get("ok") is False:
            out[h] = "did not answer over SSH"
        elif ssh.get("ok") and peers.get("error") and not peers.get("targets"):
            out[h] = "its preflight-outside step failed"
    return out


def left_out_step(j: Judge, h: str) -> None:
    """A left-out node whose preflight-outside step printed no result: its links are unknown."""
    peers = j.probe(h, "tcp_peers") or {}
    if peers.get("error") and not peers.get("targets"):
        j.fail(h, "tcp_peers", f"probe preflight-outside failed on {h}: {peers['error']}",
               f"run playbooks/preflight.yml without --limit to see {h}'s own checks")


def tcp(j: Judge) -> None:
    edges = tcp_edges(j)
    unknown = unknown_links(j)
    why = "; ".join(f"toward {h}: unknown ({r})" for h, r in unknown.items())
    for h in j.hosts:
        if h in j.left_out:
            if not (j.probe(h, "ssh") or {}).get("ok"):
                continue  # not asked at all, or it did not answer: its row says so
            if h in unknown:
                left_out_step(j, h)
                continue
        elif not j.reachable(h):
            continue
        for check in ("tcp_master", "tcp_peers"):
            tried = [e for e in edges if e["kind"] == check and h in (e["src"], e["dst"])]
            if len(j.hosts) == 1:
                j.set(h, check, NA, "single host")
            elif tried:
                n_ok = sum(1 for e in tried if e.get("ok"))
                j.set(h, check, OK, f"{n_ok}/{len(tried)} connections to/from {h} ok"
                      + (f"; {why}" if why and h not in j.left_out else ""))
            elif h in j.left_out:
                j.set(h, check, NA, "not checked: links between the nodes left out by --limit")
            elif unknown:
                j.set(h, check, SKIP, f"not checked: {why}")
            elif j.left_out:
                j.set(h, check, NA, f"toward {', '.join(j.left_out)}: not checked (left out by --limit)")
            else:
                j.set(h, check, SKIP, "no connect results")
    master_port_ok = {e["src"] for e in edges if e["kind"] == "tcp_master" and e.get("ok")}
    for e in edges:
        if e.get("ok"):
            continue
        who = blame(j, e, edges)
        detail = describe(j, e)
        if who == e["src"]:
            fix = f"allow outbound traffic on {e['src']} (e.g. sudo ufw default allow outgoing)"
        elif e.get("result") == "unreachable":
            fix = f"check the route from {e['src']} to {e['dst']} (ip route get {j.addr(e['dst'])})"
        else:
            fix = f"sudo ufw allow from {j.addr(e['src'])}  # on {e['dst']}"
        if e["kind"] == "tcp_peers" and e["src"] in master_port_ok and e["dst"] == j.master:
            detail += f"; the master port {j.port} is reachable, so only some ports are open: gloo " \
                      "needs every port from its peers"
        j.fail(who, e["kind"], detail, fix)


def lan_exposure(fw: dict) -> str | None:
    """How this node's ports are open to every host of the network, or None when its firewall drops what
    ddplab's rules do not let in (ufw on with a deny/reject default, firewalld running or not askable)."""
    if fw.get("ufw") and fw.get("ufw_enabled"):
        if fw.get("ufw_input_policy") == "ACCEPT":
            return "ufw is on but lets every host in (DEFAULT_INPUT_POLICY=\"ACCEPT\" in /etc/default/ufw)"
        return None
    if fw.get("firewalld") and fw.get("firewalld_running") is not False:
        return None
    if fw.get("firewalld"):
        return "firewalld is stopped"
    if fw.get("ufw"):
        return "ufw is off"
    return "no firewall (ufw, firewalld) is installed"


def firewall(j: Judge, h: str) -> None:
    """Closed by default: a node whose firewall lets every host of the network in fails, unless the user
    chose that (ddplab_open_to_lan). The master port's store unpickles what it is sent and every node's gloo
    listeners take any connection, so they are the lab's nodes' only (docs/lab.md)."""
    if j.all_local:
        j.set(h, "firewall", NA, "every node is this machine")
        return
    fw = j.need(h, "firewall", "firewall")
    if fw is None:
        return
    why = lan_exposure(fw)
    ports = (f"the master port {j.port} and gloo's ports" if h == j.master else "gloo's ports")
    if why is None:
        j.set(h, "firewall", OK, f"{'ufw' if fw.get('ufw_enabled') else 'firewalld'} on: {ports} take the "
                                 "lab's nodes only")
    elif j.setting(h, "open_to_lan"):
        j.set(h, "firewall", OK, f"{why} on {h}: {ports} are open to every host of the network during a run, "
                                 "as ddplab_open_to_lan: true allows", note="warning")
    else:
        how = "installs ufw and turns it on" if why.startswith("no firewall") else "turns it on"
        j.fail(h, "firewall", f"{why} on {h}: {ports} would be open to every host of the network during a "
                              "run (the master's store runs what it is sent)",
               "ansible-playbook playbooks/prepare.yml --tags firewall -e firewall_enable=true  "
               f"# {how}, SSH stays allowed; or set ddplab_open_to_lan: true to run open to the network")


def master_port(j: Judge, h: str) -> None:
    if h != j.master:
        j.set(h, "master_port", NA, "not the master")
        return
    r = j.need(h, "master_port", "port_holder")
    if not r:
        return
    if r.get("free") or r.get("nodeprobe_listener"):
        j.set(h, "master_port", OK, f"port {j.port} free on {h}")
        return
    holders = r.get("holders") or []
    if not holders:
        j.fail(h, "master_port", f"port {j.port} is held on {h} by a process this probe cannot see",
                  f"sudo ss -tlnp 'sport = :{j.port}'  # on {h}, then kill that PID")
        return
    desc = "; ".join(f"pid {x['pid']} ({x.get('cmdline')})" for x in holders)
    pids = " ".join(str(x["pid"]) for x in holders)
    j.fail(h, "master_port", f"port {j.port} is held on {h} by {desc}",
              f"kill {pids}  # {holders[0].get('cmdline')} holds {j.port}")


def stale(j: Judge, h: str) -> None:
    r = j.need(h, "stale_processes", "lab_processes")
    if not r:
        return
    procs = r.get("processes") or []
    stale = [p for p in procs if p.get("role") in ("rank", "launcher")]
    # started by hand in the lab folder (no DDPLAB_ROOT): the user's own run, never ended by ddplab
    by_hand = [p for p in stale if p.get("by_ddplab") is False]
    if by_hand:
        pids = " ".join(str(p["pid"]) for p in by_hand)
        j.fail(h, "stale_processes", f"{len(by_hand)} process(es) started by hand run in the lab folder on "
                                     f"{h} (pid {pids}: {by_hand[0]['cmdline'][:80]}); ddplab leaves them "
                                     "running",
               f"kill {pids}  # on {h}, once that run is done")
        return
    # a run whose torchrun still runs is live (nodeprobe/procs.py): prepare refuses it, it is not a leftover
    live = sorted({p["run"] for p in stale if p.get("run") and p.get("torchrun") and not p.get("orphan")})
    if live:
        pids = " ".join(str(p["pid"]) for p in stale if p.get("run") in live and p.get("torchrun"))
        j.fail(h, "stale_processes", f"run {', '.join(live)} is still running on {h} (torchrun pid {pids})",
                  f"ansible-playbook playbooks/stop.yml -e ddplab_run_id={live[0]}  # or launch with "
                  "-e ddplab_replace_running=true to end it")
        return
    if stale:
        desc = "; ".join(f"pid {p['pid']}{' (orphan)' if p.get('orphan') else ''} {p['cmdline'][:80]}"
                         for p in stale)
        j.fail(h, "stale_processes", f"{len(stale)} leftover process(es) of this lab on {h}: {desc}",
                  f"ansible-playbook playbooks/prepare.yml  # ends a lab's leftovers; or kill "
                  f"{' '.join(str(p['pid']) for p in stale)} on {h}")
    else:
        other = f" ({len(procs)} other lab process(es), e.g. tmux)" if procs else ""
        j.set(h, "stale_processes", OK, f"no leftover ranks{other}")


def smoke(j: Judge, h: str) -> None:
    r = j.need(h, "gloo_smoke", "gloo_smoke")
    if not r:
        return
    if r.get("skipped"):
        j.set(h, "gloo_smoke", NA if j.left_out else SKIP, f"not run: {r.get('reason') or 'skipped'}")
        return
    if r.get("ok"):
        bw = r.get("bandwidth") or {}
        bus = bw.get("busbw_gbit_s")
        j.set(h, "gloo_smoke", OK,
                 f"rank {r.get('rank')}/{r.get('world')}: {', '.join(r.get('checks', {}))} ok; "
                 f"all-reduce {bw.get('bytes', 0) / (1 << 20):.0f} MB in {bw.get('median_s')} s"
                 + (f", bus {bus} Gbit/s" if bus else ""))
        return
    wrong = [k for k, v in (r.get("checks") or {}).items() if not v.get("ok")]
    if wrong:
        j.fail(h, "gloo_smoke", f"wrong results from {', '.join(wrong)} on rank {r.get('rank')}",
                  f"pip install torch=={j.inv.get('torch_version') or '<same version>'} on every node")
        return
    net = ("iface", "hostname", "tcp_master", "tcp_peers", "master_port", "stale_processes")
    others = [c for c in net if any(j.rows[x].get(c, {}).get("status") == FAIL for x in j.hosts)]
    fix = (f"fix the {', '.join(others)} failures first, then re-run preflight" if others
           else (r.get("hint") or "re-run with GLOO_LOG_LEVEL=DEBUG"))
    hang = " (hung; stopped by the watchdog)" if r.get("hung") else ""
    j.fail(h, "gloo_smoke", f"rank {r.get('rank')} failed in phase {r.get('phase')}{hang}: "
                               f"{r.get('error')}", fix)
