"""The firewall role's parser of `ufw show added` (roles/firewall/filter_plugins/ufw_rules.py): pure logic."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from ddplab.lab_tag import lab_tag, retired_rule_comment, rule_comment

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


LAB = "ddplab-lab-10.77.3.10"
PORTS = ["29500", "32768:60999"]
OURS = f"""ufw allow from 10.77.3.11 to any port 29500 proto tcp comment '{LAB}'
ufw allow from 10.77.3.11 to any port 32768:60999 proto tcp comment '{LAB}'
ufw allow from 10.77.3.11 proto tcp comment '{LAB}'
ufw allow from 10.77.3.12 to any port 29500 proto tcp comment '{LAB}'
ufw allow from 10.77.3.1 to any port 22 proto tcp comment '{LAB}'
ufw allow from 10.77.3.11 to any port 29600 proto tcp comment 'ddplab-lab-10.77.3.50'
""".splitlines()


def test_stale_rules_are_ours_that_match_no_current_peer_or_port():
    ours = [r for r in ufw.ufw_rules(OURS) if r["comment"] == LAB]
    stale = [r["text"] for r in ufw.ufw_stale(ours, ["10.77.3.11"], PORTS, 22)]
    # the every-port form and a peer that left are stale; a current peer's port rules and our SSH rule stay
    assert stale == [f"ufw allow from 10.77.3.11 proto tcp comment '{LAB}'",
                     f"ufw allow from 10.77.3.12 to any port 29500 proto tcp comment '{LAB}'"]
    moved = [r["text"] for r in ufw.ufw_stale(ours, ["10.77.3.11"], ["29501", "32768:60999"], 22)]
    assert f"ufw allow from 10.77.3.11 to any port 29500 proto tcp comment '{LAB}'" in moved


def test_missing_rules_are_each_peer_and_port_without_one():
    ours = [r for r in ufw.ufw_rules(OURS) if r["comment"] == LAB]
    assert ufw.ufw_missing_peer_rules(ours, ["10.77.3.11", "10.77.3.12", "10.77.3.13"], PORTS) == [
        {"src": "10.77.3.12", "port": "32768:60999"},
        {"src": "10.77.3.13", "port": "29500"}, {"src": "10.77.3.13", "port": "32768:60999"}]
    assert ufw.ufw_missing_peer_rules(ours, [], PORTS) == []


def test_a_rule_the_node_has_under_another_comment_is_not_added_again():
    """ufw would only move it to our comment (our cleanup would then delete another lab's or the user's
    rule)."""
    theirs = ufw.ufw_rules(["ufw allow from 10.77.3.11 to any port 32768:60999 proto tcp comment 'other-lab'",
                            "ufw allow from 10.77.3.11 to any port 29500 proto tcp"])
    assert ufw.ufw_missing_peer_rules(theirs, ["10.77.3.11"], PORTS) == []


def test_two_lab_folders_with_the_same_master_have_two_tags():
    a, b = (rule_comment(lab_tag("10.77.3.10", root)) for root in ("/home/alice/ddplab", "/home/bob/ddplab"))
    assert a != b and re.fullmatch(r"ddplab-lab-[0-9a-f]{8}", a)
    rule = f"ufw allow from 10.77.3.11 to any port 29500 proto tcp comment '{a}'"
    assert ufw.ufw_rules([rule])[0]["comment"] == a


MINE, ROOT = "ddplab-lab-0000000a", "/home/alice/ddplab"
RETIRED = retired_rule_comment("10.77.3.10", ROOT)


def record(comment, root, lab_there=True, enabled=False):
    return {"file": f"/var/lib/ddplab/firewall-{comment}-n1.json", "comment": comment, "root": root,
            "host": "n1", "enabled_ufw": enabled, "lab_there": lab_there}


def test_leftovers_are_this_labs_old_tags_and_gone_labs_never_another_labs():
    rules = ufw.ufw_rules([f"ufw allow from 10.77.3.11 to any port {p} proto tcp comment '{c}'" for p, c in (
        (29500, MINE), (29501, RETIRED), (29502, "ddplab-lab-0000000b"), (29503, "ddplab-lab-0000000c"),
        (29504, "ddplab-lab-0000000d"), (29505, "ddplab-lab-0000000e"), (29506, "someone-else"))])
    records = [record(MINE, ROOT),
               record(RETIRED, None, lab_there=False, enabled=True),  # the old form's record: no folder named
               record("ddplab-lab-0000000b", ROOT),  # this lab folder under another tag (the master moved)
               record("ddplab-lab-0000000c", "/home/alice/old", lab_there=False),  # a folder that moved away
               record("ddplab-lab-0000000d", "/home/bob/ddplab"),  # another lab, whose folder is there
               record("ddplab-lab-0000000e", None, lab_there=False)]  # names no folder: not provably gone
    out = ufw.ufw_leftovers(rules, records, MINE, RETIRED, ROOT)
    assert out["comments"] == sorted([RETIRED, "ddplab-lab-0000000b", "ddplab-lab-0000000c"])
    assert [r["port"] for r in out["rules"]] == ["29501", "29502", "29503"]
    assert [r["port"] for r in out["rest"]] == ["29500", "29504", "29505", "29506"]
    assert out["files"] == [records[i]["file"] for i in (1, 2, 3)]
    assert out["enabled_ufw"]  # the old form's record says this lab turned ufw on
    assert out["current"] == {"comment": MINE, "root": ROOT, "host": "n1", "enabled_ufw": False}
    assert not ufw.ufw_leftovers(rules, records[2:], MINE, RETIRED, ROOT)["enabled_ufw"]


def test_the_ephemeral_port_range_is_written_as_ufw_wants_it():
    assert ufw.port_range("32768\t60999") == "32768:60999"
    assert ufw.port_range(" 1024 65000 ") == "1024:65000"


def _texts(rules):
    return [r["text"] for r in rules]


def test_cleanup_deletes_only_this_labs_rules_and_never_the_only_way_in():
    rules = ufw.ufw_rules(OURS)
    ssh = f"ufw allow from 10.77.3.1 to any port 22 proto tcp comment '{LAB}'"
    other_lab = "ufw allow from 10.77.3.11 to any port 29600 proto tcp comment 'ddplab-lab-10.77.3.50'"
    # ufw was on before ddplab and ours is the only SSH rule: it stays, the rest of ours goes
    plan = ufw.ufw_cleanup(rules, LAB, active=True, enabled_by_us=False, ssh_port=22)
    assert _texts(plan["keep_ssh"]) == [ssh] and not plan["disable"]
    assert ssh not in _texts(plan["delete"]) and other_lab not in _texts(plan["delete"])
    assert len(plan["delete"]) == 4
    # this lab turned ufw on: it goes back off, and then every rule of ours can go
    plan = ufw.ufw_cleanup(rules, LAB, active=True, enabled_by_us=True, ssh_port=22)
    assert plan["disable"] and plan["keep_ssh"] == [] and ssh in _texts(plan["delete"])
    # another SSH rule lets the user in: ours goes
    plan = ufw.ufw_cleanup(ufw.ufw_rules([*OURS, "ufw limit 22/tcp"]), LAB, active=True, enabled_by_us=False,
                           ssh_port=22)
    assert plan["keep_ssh"] == [] and ssh in _texts(plan["delete"])
    # ufw off: nothing can lock anyone out
    plan = ufw.ufw_cleanup(rules, LAB, active=False, enabled_by_us=True, ssh_port=22)
    assert not plan["disable"] and plan["keep_ssh"] == [] and len(plan["delete"]) == 5


def test_lines_that_are_not_rules_are_ignored():
    assert ufw.ufw_rules(["", "Added user rules:", "(None)", "ufw", "ufw allow from 'unclosed"]) == []


def test_peer_hostnames_become_ipv4_addresses_for_ufw():
    assert ufw.ipv4_addrs(["10.0.0.2", "localhost", "10.0.0.2"]) == ["10.0.0.2", "127.0.0.1"]
