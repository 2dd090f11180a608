"""Parse `ufw show added` into rules, so the firewall role decides on fields, not on Jinja regexes."""

from __future__ import annotations

import shlex

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


def ufw_stale(rules, peers, ssh_port):
    """ddplab's rules that are neither `allow from <peer> proto tcp` for a current peer nor an SSH rule
    (a node that left the inventory, the older all-protocol form)."""
    ssh = {id(r) for r in ufw_ssh_rules(rules, ssh_port)}
    def current_peer(r):
        return r["action"] == "allow" and r["src"] in peers and r["proto"] == "tcp" and r["port"] is None

    return [r for r in rules if id(r) not in ssh and not current_peer(r)]


def ufw_missing_peers(rules, peers):
    """The peers that have no `allow from <peer> proto tcp` rule among ``rules`` yet: on a prepared node
    none, so the role adds rules without one ufw call per peer (a round trip each, at 16 nodes 15)."""
    have = {r["src"] for r in rules if r["action"] == "allow" and r["proto"] == "tcp" and r["port"] is None}
    return [p for p in peers if p not in have]


class FilterModule:
    def filters(self):
        return {"ufw_rules": ufw_rules, "ufw_ssh_rules": ufw_ssh_rules, "ufw_stale": ufw_stale,
                "ufw_missing_peers": ufw_missing_peers}
