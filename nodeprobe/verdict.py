"""Preflight verdict (control host, stdlib only): probe JSON in, host x check table and JSON out.

    python -m nodeprobe.verdict --in DIR --out runs/preflight/latest.json [--manifest M] [--code DIR]

Input folder (written by the preflight role; every file optional except inventory.json):

    DIR/inventory.json        {"master_port": 29500, "torch_version": "2.13.0", "threads": 2,
                               "hosts": {"node0": {"rank": 0, "addr": "10.77.0.10", "master": true,
                                                   "local": false, "ifname": "eth0", "threads": 2}}}
                              (per-host "threads"/"ifname" override the run-wide ones; "local": true for
                              hosts that are this machine, as in inventory/local)
    DIR/manifest.json         the control host's shard manifest (or --manifest)
    DIR/control.json          {"code": {"trainer": {"sha256": ...}}} (or --code DIR, hashed here)
    DIR/<host>/ssh.json       {"ok": false, "error": "..."} when the host was unreachable
    DIR/<host>/fingerprint.json, resolve.json, iface.json, lab_processes.json, gloo_smoke.json
    DIR/<host>/port_holder.json   master only: `port-holder --port <master port>`, run BEFORE the
                                  preflight listener is started on that port
    DIR/<host>/tcp_master.json    `connect --host <master addr> --port <master port>` (workers)
    DIR/<host>/tcp_peers.json     `connect --target <peer>=<addr>:<its listen port> ...`

With ``--bundle FILE`` (``-``: stdin) the folder is first written from the preflight role's bundle of
registered Ansible results (nodeprobe/collect.py); ``--gate`` then only prints whether the gloo smoke
test may run (``{"smoke": false, "reason": ...}`` when a check it needs already failed).

Each check of each host gets status ok / FAIL / skip (not run) / n/a, a detail and the command that
fixes it. Exit 0 when every check passed, 1 on any FAIL (or when checks were not run), 2 on bad input.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from nodeprobe import collect, hashing

CHECKS = ("inventory", "ssh", "python", "torch", "gloo", "dtype", "threads", "memory", "code", "data",
          "iface", "hostname", "tcp_master", "tcp_peers", "master_port", "stale_processes", "gloo_smoke")
OK, FAIL, SKIP, NA = "ok", "FAIL", "skip", "n/a"
# Checks a failure of which makes the gloo smoke test pointless (or a sure hang): --gate skips it.
SMOKE_NEEDS = ("inventory", "ssh", "torch", "gloo", "iface", "hostname", "tcp_master", "tcp_peers",
               "master_port", "stale_processes")
# Probe errors that mean the node was never prepared (no code or no Python there).
NOT_PREPARED = ("No module named 'nodeprobe'", "No module named nodeprobe", "not prepared")
GIB = 1 << 30


class InputError(Exception):
    """The verdict's own input is unusable (no inventory): exit 2 with one line."""


def _loopback(addr: str | None) -> bool:
    try:
        return ipaddress.ip_address(str(addr)).is_loopback
    except ValueError:
        return str(addr) == "localhost"


def _gib(n) -> str:
    return f"{n / GIB:.2f} GiB" if isinstance(n, (int, float)) else "?"


class Verdict:
    def __init__(self, in_dir: Path, manifest: dict | None, control_code: dict | None):
        self.dir = in_dir
        inv_path = in_dir / "inventory.json"
        try:
            self.inv = json.loads(inv_path.read_text())
        except FileNotFoundError:
            raise InputError(f"{inv_path} is missing: the preflight role writes it first") from None
        except (OSError, ValueError) as e:
            raise InputError(f"{inv_path} is not valid JSON: {e}") from None
        hosts = self.inv.get("hosts") if isinstance(self.inv, dict) else None
        if not isinstance(hosts, dict) or not hosts:
            raise InputError(f"{inv_path} has no hosts: expected {{\"hosts\": {{\"node0\": {{...}}}}}}")
        self.hosts = {str(h): (v if isinstance(v, dict) else {}) for h, v in hosts.items()}
        self.port = self.inv.get("master_port", 29500)
        self.manifest = manifest
        self.control_code = control_code or {}
        masters = self.masters()
        self.master = masters[0] if len(masters) == 1 else None
        self.all_local = all(v.get("local") for v in self.hosts.values())
        self.rows: dict[str, dict[str, dict]] = {h: {} for h in self.hosts}
        self.probes: dict[tuple[str, str], dict | None] = {}
        self.probe_errors: dict[tuple[str, str], str] = {}

    # ---------------------------------------------------------------- helpers
    def masters(self) -> list[str]:
        flagged = [h for h, v in self.hosts.items() if v.get("master")]
        if flagged:
            return flagged
        return [h for h, v in self.hosts.items() if v.get("rank") == 0]

    def addr(self, host: str) -> str:
        v = self.hosts.get(host, {})
        return str(v.get("addr") or v.get("ansible_host") or host)

    def setting(self, host: str, key: str):
        v = self.hosts.get(host, {})
        return v.get(key) if v.get(key) is not None else self.inv.get(key)

    def probe(self, host: str, name: str) -> dict | None:
        key = (host, name)
        if key not in self.probes:
            path = self.dir / host / f"{name}.json"
            data = None
            try:
                data = json.loads(path.read_text())
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
            except FileNotFoundError:
                data = None
            except (OSError, ValueError) as e:
                self.probe_errors[key] = f"{path} is unreadable ({e}); the probe printed no JSON"
                data = None
            self.probes[key] = data
        return self.probes[key]

    def set(self, host: str, check: str, status: str, detail: str = "", fix: str = "") -> None:
        self.rows[host][check] = {"status": status, "detail": detail, "fix": fix}

    def fail(self, host: str, check: str, detail: str, fix: str = "") -> None:
        # several findings for one cell are joined, the first fix first
        cell = self.rows[host].get(check)
        if cell and cell["status"] == FAIL:
            cell["detail"] += "; " + detail
            if fix and fix not in cell["fix"]:
                cell["fix"] = (cell["fix"] + "; " + fix).strip("; ")
            return
        self.set(host, check, FAIL, detail, fix)

    def reachable(self, host: str) -> bool:
        ssh = self.probe(host, "ssh")
        return not (ssh and ssh.get("ok") is False)

    def need(self, host: str, check: str, name: str) -> dict | None:
        """The probe's JSON, or None after marking the cell skip/FAIL."""
        data = self.probe(host, name)
        if (host, name) in self.probe_errors:
            self.fail(host, check, self.probe_errors[(host, name)],
                      f"run `python -m nodeprobe {name.replace('_', '-')}` on {host} to see its error")
            return None
        if data is None:
            self.set(host, check, SKIP, f"no {name}.json: probe not run")
            return None
        if data.get("ok") is False and data.get("error") and name not in ("gloo_smoke", "ssh"):
            fix = f"run `python -m nodeprobe {name.replace('_', '-')}` on {host}"
            if any(w in data["error"] for w in NOT_PREPARED):
                fix = f"re-run playbooks/prepare.yml (the node-side code or Python is missing on {host})"
            self.fail(host, check, f"probe {name} failed on {host}: {data['error']}", fix)
            return None
        return data

    def fp(self, host: str) -> dict | None:
        return self.probe(host, "fingerprint")

    def reference(self, getter):
        """(host, value) of the master's fingerprint value, else the first host that has one."""
        order = ([self.master] if self.master else []) + [h for h in self.hosts if h != self.master]
        for h in order:
            fp = self.fp(h)
            if fp:
                try:
                    value = getter(fp)
                except (KeyError, TypeError):
                    continue
                if value is not None:
                    return h, value
        return None, None

    # ---------------------------------------------------------------- checks
    def check_inventory(self) -> None:
        masters = self.masters()
        for h in self.hosts:
            self.set(h, "inventory", OK, f"rank {self.hosts[h].get('rank')}, addr {self.addr(h)}")
        if not masters:
            for h in self.hosts:
                self.fail(h, "inventory", "no master: no host in ddplab_master (rank 0)",
                          "put exactly one host in the ddplab_master group")
        elif len(masters) > 1:
            for h in masters:
                self.fail(h, "inventory", f"{len(masters)} masters: {', '.join(masters)}",
                          "keep exactly one host in ddplab_master")
        n = len(self.hosts)
        by_rank: dict = {}
        for h, v in self.hosts.items():
            by_rank.setdefault(v.get("rank"), []).append(h)
        for rank, hs in by_rank.items():
            if not isinstance(rank, int) or not 0 <= rank < n:
                for h in hs:
                    self.fail(h, "inventory", f"ddplab_node_rank {rank!r} is outside 0..{n - 1}",
                              f"set ddplab_node_rank of {h} to a unique number in 0..{n - 1}")
            elif len(hs) > 1:
                for h in hs:
                    self.fail(h, "inventory", f"rank {rank} is used by {', '.join(hs)}",
                              f"give each host a unique ddplab_node_rank in 0..{n - 1}")
        if self.master and self.hosts[self.master].get("rank") != 0:
            self.fail(self.master, "inventory", "the master must have ddplab_node_rank 0",
                      f"set ddplab_node_rank: 0 for {self.master}")
        if n > 1 and not self.all_local:
            by_addr: dict = {}
            for h in self.hosts:
                by_addr.setdefault(self.addr(h), []).append(h)
                if _loopback(self.addr(h)):
                    self.fail(h, "inventory", f"address {self.addr(h)} is loopback: peers cannot reach it",
                              f"set ddplab_addr of {h} to its LAN address")
            for a, hs in by_addr.items():
                if len(hs) > 1:
                    for h in hs:
                        self.fail(h, "inventory", f"address {a} is shared by {', '.join(hs)}",
                                  f"set ddplab_addr of {h} to its own address")

    def check_ssh(self, h: str) -> None:
        ssh = self.probe(h, "ssh")
        if ssh and ssh.get("ok") is False:
            err = ssh.get("error") or ssh.get("msg") or "unreachable"
            self.fail(h, "ssh", f"cannot reach {h} ({self.addr(h)}) over SSH: {err}",
                      f"start sshd on {h} and check `ansible {h} -m ansible.builtin.ping`")
        else:
            self.set(h, "ssh", OK, "reached")

    def check_python(self, h: str) -> None:
        fp = self.need(h, "python", "fingerprint")
        if not fp:
            return
        mine = fp["python"]
        ref_h, ref = self.reference(lambda f: f["python"])
        if ref_h and ref_h != h and ref["major_minor"] != mine["major_minor"]:
            self.fail(h, "python", f"python {mine['version']} on {h} vs {ref['version']} on {ref_h}",
                      f"re-run playbooks/prepare.yml (torch environment) so {h} runs python "
                      f"{ref['major_minor']}")
        else:
            note = f" (micro differs from {ref_h}: {ref['version']})" if ref and ref["version"] != mine[
                "version"] else ""
            self.set(h, "python", OK, f"{mine['version']} {mine['executable']}{note}")

    def check_torch(self, h: str) -> None:
        fp = self.need(h, "torch", "fingerprint")
        if not fp:
            return
        t = fp["torch"]
        want = self.inv.get("torch_version")
        ref_h, ref = self.reference(lambda f: f["torch"] if f["torch"].get("importable") else None)
        pin = want or (ref["version"].split("+")[0] if ref else "<version>")
        fix = f"pip install torch=={pin}  # on {h}, or re-run playbooks/prepare.yml (torch environment)"
        if not t.get("importable"):
            self.fail(h, "torch", f"torch does not import on {h}: {t.get('error')}", fix)
            self.fail(h, "gloo", "torch does not import", fix)
            return
        base = t["version"].split("+")[0]
        build = f"{t['version']} ({(t.get('git_version') or '?')[:10]})"
        if want and base != str(want):
            self.fail(h, "torch", f"torch {t['version']} on {h}, the run pins {want}", fix)
        elif ref_h and ref_h != h and t["version"] != ref["version"]:
            self.fail(h, "torch", f"torch {t['version']} on {h} vs {ref['version']} on {ref_h}", fix)
        elif ref_h and ref_h != h and t.get("git_version") != ref.get("git_version"):
            self.fail(h, "torch", f"same version, different build on {h}: {t.get('git_version')} vs "
                                  f"{ref.get('git_version')} on {ref_h}", fix)
        else:
            self.set(h, "torch", OK, build)
        if not t.get("gloo_available"):
            self.fail(h, "gloo", f"torch {t['version']} on {h} has no gloo backend",
                      f"pip install torch=={pin}  # the CPU wheel includes gloo")
        elif "gloo" not in self.rows[h]:
            self.set(h, "gloo", OK, "gloo available")

    def check_dtype(self, h: str) -> None:
        fp = self.need(h, "dtype", "fingerprint")
        if not fp:
            return
        d = fp["dtype"]
        ref_h, ref = self.reference(lambda f: f["dtype"]["resolved"])
        if d.get("problem"):
            self.fail(h, "dtype", f"{d['problem']} ({d['reason']})", "use --dtype fp32")
        elif ref_h and ref_h != h and d["resolved"] != ref:
            self.fail(h, "dtype", f"{h} resolves {d['resolved']} ({d['reason']}), {ref_h} resolves {ref}",
                      "use --dtype fp32 on every node")
        else:
            self.set(h, "dtype", OK, f"{d['resolved']}: {d['reason']}")

    def _sharing(self, h: str) -> list[str]:
        """Hosts running on the same machine as h (inventory 'local' hosts share this machine)."""
        return [x for x in self.hosts if self.hosts[x].get("local")] if self.hosts[h].get("local") else [h]

    def check_threads(self, h: str) -> None:
        fp = self.need(h, "threads", "fingerprint")
        if not fp:
            return
        cpu = fp["cpu"]
        phys = cpu.get("physical_cores")
        share = self._sharing(h)
        threads = [cpu.get("threads") or self.setting(x, "threads") for x in share]
        if not all(threads):
            self.set(h, "threads", OK, f"threads not set (trainer default); {phys} physical cores, "
                                       f"{cpu.get('logical')} logical")
            return
        total = sum(int(t) for t in threads)
        where = f"{len(share)} ranks on this machine x {threads[0]}" if len(share) > 1 else f"{total}"
        if phys and total > phys:
            per = max(1, phys // len(share))
            self.fail(h, "threads", f"threads {where} > {phys} physical cores ({cpu.get('logical')} logical)",
                      f"set ddplab_threads <= {per} (physical cores{' / ranks' if len(share) > 1 else ''})")
        else:
            self.set(h, "threads", OK, f"threads {where} <= {phys} physical cores")

    def check_memory(self, h: str) -> None:
        fp = self.need(h, "memory", "fingerprint")
        if not fp:
            return
        m = fp["memory"]
        need = m.get("estimate_bytes") or 0
        n = len(self._sharing(h))
        total = need * n
        avail = m.get("available_bytes")
        what = f"~{_gib(total)} estimated ({m.get('estimate_method')}{f', x{n} ranks' if n > 1 else ''})"
        if avail is None:
            self.set(h, "memory", OK, f"{what}; available memory unknown")
        elif total > avail:
            self.fail(h, "memory", f"{what} > {_gib(avail)} available on {h}",
                      f"free memory on {h} or train a smaller model (lower --depth / --batch-size)")
        else:
            self.set(h, "memory", OK, f"{what} <= {_gib(avail)} available")

    def check_code(self, h: str) -> None:
        fp = self.need(h, "code", "fingerprint")
        if not fp:
            return
        code = fp.get("code") or {}
        if not code:
            self.set(h, "code", SKIP, "fingerprint ran without --code")
            return
        bad, shown = [], []
        for name, info in sorted(code.items()):
            if info.get("error"):
                bad.append(f"{name}: {info['error']}")
                continue
            ref = (self.control_code.get(name) or {}).get("sha256")
            ref_from = "the control host"
            if ref is None:
                ref_h, ref = self.reference(lambda f, n=name: f["code"][n]["sha256"])
                ref_from = ref_h
            if ref and ref_from != h and info["sha256"] != ref:
                bad.append(f"{name}/ differs from {ref_from} ({info['sha256'][:12]} vs {ref[:12]})")
            shown.append(f"{name} {info['sha256'][:12]}")
        if bad:
            names = ", ".join(sorted({b.split('/')[0].split(':')[0] for b in bad}))
            self.fail(h, "code", "; ".join(bad), f"re-run playbooks/prepare.yml to sync {names}/ to {h}")
        else:
            self.set(h, "code", OK, ", ".join(shown))

    def check_data(self, h: str) -> None:
        fp = self.need(h, "data", "fingerprint")
        if not fp:
            return
        data = fp.get("data")
        fix_all = "re-run playbooks/prepare.yml (dataset)"
        if not data:
            if self.manifest is None:  # no shards asked for (your own code with ddplab_data_dir "")
                self.set(h, "data", NA, "no shards (ddplab_data_dir is empty)")
            else:
                self.set(h, "data", SKIP, "fingerprint ran without --data")
            return
        if data.get("error"):
            self.fail(h, "data", data["error"], fix_all)
            return
        if self.manifest is not None:
            expected, ref_name = hashing.manifest_files(self.manifest), "the control host's manifest"
        else:
            ref_h, expected = self.reference(lambda f: (f.get("data") or {}).get("files"))
            ref_name = ref_h
            if ref_h == h or expected is None:
                self.set(h, "data", OK, f"{data['count']} shards, digest {data['digest'][:12]} "
                                        "(no control manifest to compare with)")
                return
        diff = hashing.compare(data["files"], expected)
        parts = [f"{k}: {', '.join(v)}" for k, v in diff.items() if v]
        if parts:
            files = diff["missing"] + diff["changed"]
            fix = fix_all + (f" to resync {', '.join(files)}" if files else "")
            if diff["extra"]:
                fix += f"{' and' if files else ' to'} remove {', '.join(diff['extra'])}"
            self.fail(h, "data", f"shards on {h} differ from {ref_name}: " + "; ".join(parts), fix)
            return
        node_digest = data.get("manifest_digest")
        if self.manifest is not None and node_digest not in (None, self.manifest.get("digest")):
            self.fail(h, "data", f"{h}'s manifest.json is not the control host's (digest "
                                 f"{str(node_digest)[:12]})", fix_all + " to resync manifest.json")
            return
        self.set(h, "data", OK, f"{data['count']} shards, digest {data['digest'][:12]} matches {ref_name}")

    def check_iface(self, h: str) -> None:
        r = self.need(h, "iface", "iface")
        if not r:
            return
        dev, src, fam = r.get("dev"), r.get("src"), r.get("family")
        want = self.setting(h, "ifname")
        ipv4_devs = [i["name"] for i in r.get("interfaces", []) if "ipv4" in i.get("families", [])
                     and not i.get("loopback")]
        good = dev if dev and not r.get("dev_loopback") else (ipv4_devs[0] if ipv4_devs else "eth0")
        desc = f"{dev} (src {src} -> master {r.get('master')})"
        if fam != "ipv4":
            self.fail(h, "iface", f"the master address {r.get('master')} is {fam}: peers must share IPv4",
                      f"set ddplab_addr of the master to its IPv4 address; export GLOO_SOCKET_IFNAME={good}")
        elif r.get("dev_loopback") and not self.all_local:
            self.fail(h, "iface", f"the route to the master goes via loopback {dev}",
                      f"set the master's ddplab_addr to its LAN address; export GLOO_SOCKET_IFNAME={good}")
        elif not r.get("same_subnet"):
            self.fail(h, "iface", f"{desc}: {src} is not on the master's subnet (routed via "
                                  f"{(r.get('route') or {}).get('gateway')})",
                      f"put {h} on the master's LAN, or export GLOO_SOCKET_IFNAME=<the LAN interface>")
        elif want and want != dev and not self.all_local:
            self.fail(h, "iface", f"GLOO_SOCKET_IFNAME={want} but the route to the master uses {dev}",
                      f"export GLOO_SOCKET_IFNAME={dev}")
        else:
            extra = [i["name"] for i in r.get("interfaces", []) if "ipv6" in i.get("families", [])
                     and "ipv4" not in i.get("families", []) and not i.get("loopback")]
            note = f"; IPv6-only interfaces {', '.join(extra)} (pin GLOO_SOCKET_IFNAME={dev})" \
                if extra else ""
            self.set(h, "iface", OK, f"{desc}, IPv4, same subnet{note}")

    def check_hostname(self, h: str) -> None:
        r = self.need(h, "hostname", "resolve")
        if not r:
            return
        name = r.get("hostname")
        addr = self.addr(h)
        fix = f"fix /etc/hosts on {h} so {name} maps to {addr}"
        addrs = ", ".join(a["address"] for a in r.get("addresses", []))
        if not r.get("resolves"):
            self.fail(h, "hostname", f"hostname {name} does not resolve ({r.get('error')}): gloo falls back "
                                     "to loopback", f"add '{addr} {name}' to /etc/hosts on {h}")
        elif r.get("first_ipv6"):
            self.fail(h, "hostname", f"{name} resolves first to IPv6 {r['first']['address']} (all: {addrs}): "
                                     "gloo mixes families (ss_family 10 vs 2)",
                      f"{fix}, and export GLOO_SOCKET_IFNAME=<its IPv4 LAN interface>")
        elif r.get("any_loopback") and not self.all_local:
            self.fail(h, "hostname", f"{name} resolves to loopback ({addrs}): gloo would use loopback", fix)
        elif r.get("first_is_local") is False:
            self.fail(h, "hostname", f"{name} resolves to {addrs}, not an address of {h}", fix)
        else:
            self.set(h, "hostname", OK, f"{name} -> {addrs}")

    # ---------------------------------------------------------------- TCP matrix
    def edges(self) -> list[dict]:
        """Every connect result as an edge src -> dst with its kind (master port or peer port)."""
        out = []
        for s in self.hosts:
            r = self.probe(s, "tcp_master")
            if r and self.master and s != self.master:
                out.append({"src": s, "dst": self.master, "kind": "tcp_master", **r})
            r = self.probe(s, "tcp_peers")
            for d, res in ((r or {}).get("targets") or {}).items():
                if d in self.hosts and d != s:
                    out.append({"src": s, "dst": d, "kind": "tcp_peers", **res})
        return out

    def blame(self, e: dict, edges: list[dict]) -> str:
        """Inbound firewalls are the usual cause: blame the destination, unless the source fails
        every connection it tried while someone else reached those destinations (its outbound)."""
        mine = [x for x in edges if x["src"] == e["src"]]
        if all(not x.get("ok") for x in mine) and len(mine) > 1:
            targets = {m["dst"] for m in mine}
            if any(x.get("ok") and x["src"] != e["src"] and x["dst"] in targets for x in edges):
                return e["src"]
        return e["dst"]

    def describe(self, e: dict) -> str:
        how = {"timeout": f"timed out after {e.get('timeout_s')} s (packets dropped: firewall)",
               "refused": "refused (nothing listening, or a firewall rejects)",
               "unreachable": "unreachable (no route)"}.get(e.get("result"),
                                                            f"{e.get('result')}: {e.get('error')}")
        return f"{e['src']} -> {e['dst']} {e.get('address') or self.addr(e['dst'])}:{e.get('port')} {how}"

    def check_tcp(self) -> None:
        edges = self.edges()
        for h in self.hosts:
            if not self.reachable(h):
                continue
            for check in ("tcp_master", "tcp_peers"):
                tried = [e for e in edges if e["kind"] == check and h in (e["src"], e["dst"])]
                if len(self.hosts) == 1:
                    self.set(h, check, NA, "single host")
                elif tried:
                    n_ok = sum(1 for e in tried if e.get("ok"))
                    self.set(h, check, OK, f"{n_ok}/{len(tried)} connections to/from {h} ok")
                else:
                    self.set(h, check, SKIP, "no connect results")
        master_port_ok = {e["src"] for e in edges if e["kind"] == "tcp_master" and e.get("ok")}
        for e in edges:
            if e.get("ok"):
                continue
            who = self.blame(e, edges)
            detail = self.describe(e)
            if who == e["src"]:
                fix = f"allow outbound traffic on {e['src']} (e.g. sudo ufw default allow outgoing)"
            elif e.get("result") == "unreachable":
                fix = f"check the route from {e['src']} to {e['dst']} (ip route get {self.addr(e['dst'])})"
            else:
                fix = f"sudo ufw allow from {self.addr(e['src'])}  # on {e['dst']}"
            if e["kind"] == "tcp_peers" and e["src"] in master_port_ok and e["dst"] == self.master:
                detail += f"; the master port {self.port} is reachable, so only some ports are open: gloo " \
                          "needs every port from its peers"
            self.fail(who, e["kind"], detail, fix)

    def check_master_port(self, h: str) -> None:
        if h != self.master:
            self.set(h, "master_port", NA, "not the master")
            return
        r = self.need(h, "master_port", "port_holder")
        if not r:
            return
        if r.get("free") or r.get("nodeprobe_listener"):
            self.set(h, "master_port", OK, f"port {self.port} free on {h}")
            return
        holders = r.get("holders") or []
        if not holders:
            self.fail(h, "master_port", f"port {self.port} is held on {h} by a process this probe cannot see",
                      f"sudo ss -tlnp 'sport = :{self.port}'  # on {h}, then kill that PID")
            return
        desc = "; ".join(f"pid {x['pid']} ({x.get('cmdline')})" for x in holders)
        pids = " ".join(str(x["pid"]) for x in holders)
        self.fail(h, "master_port", f"port {self.port} is held on {h} by {desc}",
                  f"kill {pids}  # {holders[0].get('cmdline')} holds {self.port}")

    def check_stale(self, h: str) -> None:
        r = self.need(h, "stale_processes", "lab_processes")
        if not r:
            return
        procs = r.get("processes") or []
        stale = [p for p in procs if p.get("role") in ("rank", "launcher")]
        if stale:
            desc = "; ".join(f"pid {p['pid']}{' (orphan)' if p.get('orphan') else ''} {p['cmdline'][:80]}"
                             for p in stale)
            self.fail(h, "stale_processes", f"{len(stale)} leftover process(es) of this lab on {h}: {desc}",
                      f"kill {' '.join(str(p['pid']) for p in stale)}  # on {h}, or run playbooks/stop.yml")
        else:
            other = f" ({len(procs)} other lab process(es), e.g. tmux)" if procs else ""
            self.set(h, "stale_processes", OK, f"no leftover ranks{other}")

    def check_smoke(self, h: str) -> None:
        r = self.need(h, "gloo_smoke", "gloo_smoke")
        if not r:
            return
        if r.get("skipped"):
            self.set(h, "gloo_smoke", SKIP, f"not run: {r.get('reason') or 'skipped'}")
            return
        if r.get("ok"):
            bw = r.get("bandwidth") or {}
            bus = bw.get("busbw_gbit_s")
            self.set(h, "gloo_smoke", OK,
                     f"rank {r.get('rank')}/{r.get('world')}: {', '.join(r.get('checks', {}))} ok; "
                     f"all-reduce {bw.get('bytes', 0) / (1 << 20):.0f} MB in {bw.get('median_s')} s"
                     + (f", bus {bus} Gbit/s" if bus else ""))
            return
        wrong = [k for k, v in (r.get("checks") or {}).items() if not v.get("ok")]
        if wrong:
            self.fail(h, "gloo_smoke", f"wrong results from {', '.join(wrong)} on rank {r.get('rank')}",
                      f"pip install torch=={self.inv.get('torch_version') or '<same version>'} on every node")
            return
        net = ("iface", "hostname", "tcp_master", "tcp_peers", "master_port", "stale_processes")
        others = [c for c in net if any(self.rows[x].get(c, {}).get("status") == FAIL for x in self.hosts)]
        fix = (f"fix the {', '.join(others)} failures first, then re-run preflight" if others
               else (r.get("hint") or "re-run with GLOO_LOG_LEVEL=DEBUG"))
        hang = " (hung; stopped by the watchdog)" if r.get("hung") else ""
        self.fail(h, "gloo_smoke", f"rank {r.get('rank')} failed in phase {r.get('phase')}{hang}: "
                                   f"{r.get('error')}", fix)

    # ---------------------------------------------------------------- run
    def run(self) -> dict:
        self.check_inventory()
        for h in self.hosts:
            self.check_ssh(h)
        for h in self.hosts:
            if not self.reachable(h):
                for c in CHECKS[2:]:
                    self.set(h, c, SKIP, "host unreachable over SSH")
                continue
            self.check_python(h)
            self.check_torch(h)
            self.check_dtype(h)
            self.check_threads(h)
            self.check_memory(h)
            self.check_code(h)
            self.check_data(h)
            self.check_iface(h)
            self.check_hostname(h)
            self.check_master_port(h)
            self.check_stale(h)
        self.check_tcp()
        for h in self.hosts:
            if self.reachable(h):
                self.check_smoke(h)
            if "gloo" not in self.rows[h]:
                self.set(h, "gloo", SKIP, "no fingerprint")
        failures = [{"host": h, "check": c, **self.rows[h][c]} for h in self.hosts for c in CHECKS
                    if self.rows[h][c]["status"] == FAIL]
        skipped = [(h, c) for h in self.hosts for c in CHECKS if self.rows[h][c]["status"] == SKIP]
        bandwidth = None
        if self.master and (self.probe(self.master, "gloo_smoke") or {}).get("bandwidth"):
            bandwidth = self.probe(self.master, "gloo_smoke")["bandwidth"]
        return {
            "version": 1,
            "ok": not failures and not skipped,
            "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "master": self.master,
            "master_port": self.port,
            "checks": list(CHECKS),
            "hosts": {h: {c: self.rows[h][c] for c in CHECKS} for h in self.hosts},
            "failures": failures,
            "not_run": [f"{h}:{c}" for h, c in skipped],
            "bandwidth": bandwidth,
        }


def table(result: dict) -> str:
    hosts = list(result["hosts"])
    width = max(len("check"), *(len(c) for c in CHECKS))
    cols = [max(6, len(h)) for h in hosts]
    lines = ["  ".join(["check".ljust(width)] + [h.ljust(w) for h, w in zip(hosts, cols, strict=True)])]
    for c in CHECKS:
        cells = [result["hosts"][h][c]["status"].replace(NA, "-") for h in hosts]
        lines.append("  ".join([c.ljust(width)] + [x.ljust(w) for x, w in zip(cells, cols, strict=True)]))
    for f in result["failures"]:
        lines.append(f"FAIL {f['host']} {f['check']}: {f['detail']}")
        if f["fix"]:
            lines.append(f"     fix: {f['fix']}")
    if result["bandwidth"] and result["bandwidth"].get("busbw_gbit_s"):
        bw = result["bandwidth"]
        lines.append(f"gloo all-reduce {bw['bytes'] / (1 << 20):.0f} MB: {bw['median_s']} s, "
                     f"bus bandwidth {bw['busbw_gbit_s']} Gbit/s")
    if result["failures"]:
        lines.append(f"preflight: FAIL ({len(result['failures'])} failing checks)")
    elif result["not_run"]:
        lines.append(f"preflight: INCOMPLETE ({len(result['not_run'])} checks not run: "
                     f"{', '.join(result['not_run'][:6])})")
    else:
        lines.append("preflight: ok")
    return "\n".join(lines)


def gate(result: dict) -> dict:
    """May the gloo smoke test run? Not when a check it depends on failed: it would only hang until
    its watchdog and then blame the network that the failed check already named."""
    failed = [f"{f['host']}:{f['check']}" for f in result["failures"] if f["check"] in SMOKE_NEEDS]
    if failed:
        return {"smoke": False, "failed": failed,
                "reason": f"{', '.join(failed[:4])}{' ...' if len(failed) > 4 else ''} failed first"}
    return {"smoke": True, "failed": [], "reason": ""}


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m nodeprobe.verdict", description=__doc__.split("\n")[0])
    p.add_argument("--in", dest="in_dir", required=True, type=Path, help="folder of collected probe JSON")
    p.add_argument("--out", type=Path, default=Path("runs/preflight/latest.json"), help="verdict JSON")
    p.add_argument("--manifest", type=Path, help="control host's manifest.json (default: IN/manifest.json)")
    p.add_argument("--code", action="append", type=Path, default=[],
                   help="control host's code folder to compare with (repeatable; default IN/control.json)")
    p.add_argument("--code-ref", action="append", default=[], metavar="NAME=SHA256",
                   help="the control host's tree hash of code folder NAME (repeatable), e.g. the user's "
                        "code as roles/code_sync/files/code_tree.py hashes what it would sync")
    p.add_argument("--bundle", help="first write --in from this bundle of Ansible results ('-' = stdin; "
                                    "format in nodeprobe/collect.py)")
    p.add_argument("--gate", action="store_true",
                   help="print {\"smoke\": true/false, \"reason\": ...}: may the gloo smoke test run? "
                        "(no table, --out untouched, exit 0)")
    args = p.parse_args(argv)
    try:
        if args.bundle:
            try:
                text = sys.stdin.read() if args.bundle == "-" else Path(args.bundle).read_text()
                collect.unpack(json.loads(text), args.in_dir)
            except (OSError, ValueError) as e:
                raise InputError(f"--bundle {args.bundle}: {e}") from None
            except collect.BundleError as e:
                raise InputError(f"--bundle {args.bundle}: {e}") from None
        if not args.in_dir.is_dir():
            raise InputError(f"--in {args.in_dir} is not a folder of probe results")
        manifest = None
        mpath = args.manifest or args.in_dir / "manifest.json"
        if args.manifest or mpath.exists():
            manifest, err = hashing.load_manifest(mpath)
            if err:
                raise InputError(f"control manifest: {err}")
        control_code = {}
        cpath = args.in_dir / "control.json"
        if cpath.exists():
            try:
                control_code = json.loads(cpath.read_text()).get("code") or {}
            except (OSError, ValueError, AttributeError) as e:
                raise InputError(f"{cpath} is not valid JSON: {e}") from None
        for d in args.code:
            info = hashing.tree_hash(d)
            if info.get("error"):
                raise InputError(f"--code: {info['error']}")
            control_code[d.resolve().name] = info
        for ref in args.code_ref:
            name, _, sha = ref.partition("=")
            if not name or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
                raise InputError(f"--code-ref {ref!r}: use NAME=<64 hex digits>")
            control_code[name] = {"sha256": sha}
        result = Verdict(args.in_dir, manifest, control_code).run()
    except InputError as e:
        print(f"ddplab: error: {e}", file=sys.stderr)
        return 2
    if args.gate:
        print(json.dumps(gate(result)))
        return 0
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"written: {args.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
