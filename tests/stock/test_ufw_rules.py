"""The firewall role's parser of `ufw show added` (roles/firewall/filter_plugins/ufw_rules.py): pure logic."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "ufw_rules", REPO / "roles" / "firewall" / "filter_plugins" / "ufw_rules.py")
ufw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ufw)

# What ufw 0.36 (Debian 12) printed on a stock host for these rules.
SHOWN = """Added user rules (see 'ufw status' for running firewall):
ufw limit 22/tcp
ufw allow from 10.77.3.11 proto tcp comment 'ddplab'
ufw allow from 10.77.3.1 to any port 22 proto tcp comment 'ddplab'
ufw allow from 10.9.0.0/16 to any port 22
ufw allow from 10.77.3.12 comment 'ddplab'
ufw allow OpenSSH
ufw allow 80/tcp comment 'web server'
""".splitlines()


def test_rules_are_parsed_into_fields():
    rules = ufw.ufw_rules(SHOWN)
    assert [r["text"] for r in rules] == SHOWN[1:]
    by = {r["text"]: r for r in rules}
    limit = by["ufw limit 22/tcp"]
    assert (limit["action"], limit["src"], limit["port"], limit["proto"], limit["comment"]) == \
        ("limit", "any", "22", "tcp", None)
    peer = by["ufw allow from 10.77.3.11 proto tcp comment 'ddplab'"]
    fields = (peer["src"], peer["port"], peer["proto"], peer["comment"])
    assert fields == ("10.77.3.11", None, "tcp", "ddplab")
    assert peer["argv"] == ["allow", "from", "10.77.3.11", "proto", "tcp", "comment", "ddplab"]
    subnet = by["ufw allow from 10.9.0.0/16 to any port 22"]
    assert (subnet["src"], subnet["port"], subnet["proto"]) == ("10.9.0.0/16", "22", None)
    assert by["ufw allow 80/tcp comment 'web server'"]["comment"] == "web server"


def test_ssh_rules_are_found_by_port_or_name():
    rules = ufw.ufw_rules(SHOWN)
    ssh = [r["text"] for r in ufw.ufw_ssh_rules(rules, 22)]
    assert ssh == ["ufw limit 22/tcp", "ufw allow from 10.77.3.1 to any port 22 proto tcp comment 'ddplab'",
                   "ufw allow from 10.9.0.0/16 to any port 22", "ufw allow OpenSSH"]
    assert ufw.ufw_ssh_rules(rules, 2222) == [r for r in rules if r["port"] == "OpenSSH"]
    assert ufw.ufw_ssh_rules(ufw.ufw_rules(["ufw allow 80/tcp"]), 22) == []


def test_stale_rules_are_ours_that_match_no_current_peer():
    ours = [r for r in ufw.ufw_rules(SHOWN) if r["comment"] == "ddplab"]
    stale = [r["text"] for r in ufw.ufw_stale(ours, ["10.77.3.11"], 22)]
    # the old all-protocol form is stale; the TCP rule of a current peer and our SSH rule are kept
    assert stale == ["ufw allow from 10.77.3.12 comment 'ddplab'"]
    gone = [r["text"] for r in ufw.ufw_stale(ours, [], 22)]
    assert gone == ["ufw allow from 10.77.3.11 proto tcp comment 'ddplab'",
                    "ufw allow from 10.77.3.12 comment 'ddplab'"]


def test_lines_that_are_not_rules_are_ignored():
    assert ufw.ufw_rules(["", "Added user rules:", "(None)", "ufw", "ufw allow from 'unclosed"]) == []


def test_missing_peers_are_those_without_our_tcp_rule():
    ours = [r for r in ufw.ufw_rules(SHOWN) if r["comment"] == "ddplab"]
    # .11 has the TCP rule; .12 only the old all-protocol form; .13 nothing; .1 only an SSH rule
    assert ufw.ufw_missing_peers(ours, ["10.77.3.11", "10.77.3.12", "10.77.3.13", "10.77.3.1"]) == \
        ["10.77.3.12", "10.77.3.13", "10.77.3.1"]
    assert ufw.ufw_missing_peers(ours, []) == []
