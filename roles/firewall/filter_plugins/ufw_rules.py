"""Parse `ufw show added` into rules, so the firewall role decides on fields, not on Jinja regexes."""

from __future__ import annotations

import ipaddress
import shlex
import socket

from ddplab.lab_tag import RULE_PREFIX

SSH_NAMES = {"ssh", "openssh"}


def ufw_rules(lines):
    """Each `ufw ...` line of `ufw show added` as a dict: text, argv (without `ufw`, usable after
    `ufw delete`), action (allow/limit/deny/reject), src ('any' when unset), port, proto, comment."""
    rules = []
    for line in lines:
        line = line.strip()
        if not line.startswith("ufw "):
            continue
        try:
            argv = shlex.split(line)[1:]
        except ValueError:
            continue
        if not argv:
            continue
        rule = {"text": line, "argv": argv, "action": argv[0], "src": "any", "port": None, "proto": None,
                "comment": None}
        rest = argv[1:]
        if rest and rest[0] in ("in", "out"):
            rest = rest[1:]
        i = 0
        while i < len(rest):
            word, nxt = rest[i], rest[i + 1] if i + 1 < len(rest) else None
            if word in ("from", "port", "proto", "comment") and nxt is not None:
                rule["src" if word == "from" else word] = nxt
                i += 2
            elif word == "to" and nxt is not None:
                i += 2
            elif i == 0:  # the simple form: `ufw limit 22/tcp`, `ufw allow OpenSSH`
                port, _, proto = word.partition("/")
                rule["port"], rule["proto"] = port, proto or rule["proto"]
                i += 1
            else:
                i += 1
        rules.append(rule)
    return rules


def ufw_ssh_rules(rules, port):
    """The rules that let SSH in on `port` (allow or limit, any source, by number or by name)."""
    port = str(port)
    return [r for r in rules if r["action"] in ("allow", "limit")
            and (r["port"] == port or (r["port"] or "").lower() in SSH_NAMES)
            and r["proto"] in (None, "tcp")]


def _peer_rule(r, peers, ports) -> bool:
    """`allow from <peer> to any port <one of ports> proto tcp`: what the role adds now."""
    return r["action"] == "allow" and r["src"] in peers and r["proto"] == "tcp" and r["port"] in ports


def ufw_stale(rules, peers, ports, ssh_port):
    """ddplab's rules that are neither a current peer's rule for a port in use nor an SSH rule (a node
    that left the inventory, a port no longer used, the older every-port forms)."""
    ports = [str(p) for p in ports]
    ssh = {id(r) for r in ufw_ssh_rules(rules, ssh_port)}
    return [r for r in rules if id(r) not in ssh and not _peer_rule(r, peers, ports)]


def ufw_leftovers(rules, records, comment, retired, root):
    """This lab's rules under a tag it no longer has, and their records: {"rules", "rest" (the other rules),
    "comments", "files", "enabled_ufw", "current" (this lab's record as the node holds it, or None)}.
    ``records`` are nodeprobe/firewall_read.py's (root's own, written by this role only). A comment is a
    leftover when it is ddplab's (``ddplab-lab-``) and provably this lab's or a gone lab's: ``retired``
    (this lab's comment in the form before ddplab/lab_tag.py was its one home), a record of this node's
    lab folder ``root`` under another tag (the master's address or folder changed), or a record whose lab
    folder holds no lab any more (the lab folder moved or went). Another lab's record, whose folder is
    there, and a record that names no folder are never leftovers. ``enabled_ufw``: this lab turned ufw on
    (its current record or one of its own folder's says so), so the cleanup turns it back off."""
    def own(r):
        return r["comment"] == retired or r["root"] == root

    old = [r for r in records if r["comment"] != comment and r["comment"].startswith(RULE_PREFIX)
           and (own(r) or (r["root"] is not None and not r["lab_there"]))]
    comments = sorted({retired} | {r["comment"] for r in old})
    now = next(({k: r[k] for k in ("comment", "root", "host", "enabled_ufw")} for r in records
                if r["comment"] == comment), None)
    return {"rules": [r for r in rules if r["comment"] in comments],
            "rest": [r for r in rules if r["comment"] not in comments],
            "comments": comments, "files": [r["file"] for r in old], "current": now,
            "enabled_ufw": any(r["enabled_ufw"] for r in records if r["comment"] == comment or own(r))}


def ufw_missing_peer_rules(rules, peers, ports):
    """{src, port} for each peer and port that has no `allow from <peer> to any port <port> proto tcp`
    among ``rules`` yet: on a prepared node none, so the role adds rules without one ufw call per rule.
    ``rules`` are all of the node's: ufw takes a rule that differs only in its comment for the same rule and
    puts the new comment on it, so adding one that another lab or the user already has would make it ours
    (and our cleanup would delete it)."""
    ports = [str(p) for p in ports]
    have = {(r["src"], r["port"]) for r in rules if _peer_rule(r, peers, ports)}
    return [{"src": p, "port": port} for p in peers for port in ports if (p, port) not in have]


def ufw_cleanup(rules, comments, active, enabled_by_us, ssh_port):
    """What `stop.yml -e ddplab_firewall_cleanup=true` does on one node: {"delete": [rules], "keep_ssh":
    [rules], "disable": bool}. Only rules tagged one of ``comments`` (this lab's, and its leftovers) are
    deleted; ufw goes back off when this lab turned it on; an SSH rule of ours stays while ufw stays on and no
    other rule lets SSH in, so a cleanup never locks the user out."""
    comments = [comments] if isinstance(comments, str) else list(comments)
    ours = [r for r in rules if r["comment"] in comments]
    disable = bool(active and enabled_by_us)
    others_ssh = [r for r in ufw_ssh_rules(rules, ssh_port) if r["comment"] not in comments]
    keep = [] if disable or not active or others_ssh else ufw_ssh_rules(ours, ssh_port)
    keep_ids = {id(r) for r in keep}
    return {"delete": [r for r in ours if id(r) not in keep_ids], "keep_ssh": keep, "disable": disable}


def ipv4_addrs(addrs):
    """Each peer's inventory address as an IPv4 address, hostnames resolved on the control host (ufw's
    from_ip takes addresses only); a name that does not resolve stops the play with one message."""
    out = []
    for addr in addrs:
        try:
            out.append(str(ipaddress.IPv4Address(addr)))
            continue
        except ValueError:
            pass
        try:
            out.append(socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
        except (OSError, IndexError) as e:
            from ansible.errors import AnsibleFilterError

            raise AnsibleFilterError(
                f"ddplab: error: the peer address {addr} does not resolve to an IPv4 address on the control "
                f"host ({e}); the firewall lets peers in by address: set ddplab_addr to the node's IPv4 "
                "address") from None
    return list(dict.fromkeys(out))


def port_range(text):
    """`ip_local_port_range`'s "32768\t60999" as ufw's "32768:60999" (the ports gloo listens on)."""
    lo, hi = (int(x) for x in str(text).split())
    return f"{lo}:{hi}"


class FilterModule:
    def filters(self):
        return {"ufw_rules": ufw_rules, "ufw_ssh_rules": ufw_ssh_rules, "ufw_stale": ufw_stale,
                "ufw_leftovers": ufw_leftovers,
                "ufw_missing_peer_rules": ufw_missing_peer_rules, "ufw_cleanup": ufw_cleanup,
                "port_range": port_range, "ipv4_addrs": ipv4_addrs}
