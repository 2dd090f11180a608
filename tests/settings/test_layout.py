"""The inventory's shape: groups, --limit, ranks, addresses (the rules of the former inventory_check)."""

import pytest
from settings_helpers import errors, inventory, lines, one_error, shards  # noqa: F401


def test_missing_group_is_an_error(shards):  # noqa: F811
    inv = inventory(shards)
    inv["groups"] = {"all": ["node0", "node1"], "nodes": ["node0", "node1"]}
    line = one_error(inv, "group ddplab_nodes")
    assert "missing in the inventory" in line and "inventory/example/hosts.yml" in line


def test_empty_group(shards):  # noqa: F811
    inv = inventory(shards)
    inv["groups"]["ddplab_nodes"] = []
    assert "empty" in one_error(inv, "group ddplab_nodes")


@pytest.mark.parametrize("masters", [[], ["node0", "node1"]])
def test_exactly_one_master(shards, masters):  # noqa: F811
    inv = inventory(shards)
    inv["groups"]["ddplab_master"] = masters
    assert f"{len(masters)} hosts" in one_error(inv, "group ddplab_master")


def test_limit_that_leaves_out_nodes_is_not_a_settings_error(shards):  # noqa: F811
    """prepare/preflight -l work on part of the lab; launch.yml refuses a partial limit in its own play."""
    inv = {**inventory(shards, nodes=3), "play_hosts": ["node0", "node2"]}
    assert errors(inv) == []


@pytest.mark.parametrize(("ranks", "found"), [
    ([0, 0], '{"node0": 0, "node1": 0}'), ([1, 0], '{"node0": 1, "node1": 0}'),
    ([0, 2], '{"node0": 0, "node1": 2}'),
])
def test_ranks(shards, ranks, found):  # noqa: F811
    inv = inventory(shards)
    for h, r in zip(("node0", "node1"), ranks, strict=True):
        inv["hosts"][h]["vars"]["ddplab_node_rank"] = r
    line = one_error(inv, "ddplab_node_rank")
    assert f"(all): {found}; 0..1, each once, with the master (node0) at 0" in line


def test_rank_missing_or_not_a_number(shards):  # noqa: F811
    inv = inventory(shards)
    del inv["hosts"]["node1"]["vars"]["ddplab_node_rank"]
    assert one_error(inv, "ddplab_node_rank").startswith("ddplab: error: ddplab_node_rank (node1): missing")
    inv["hosts"]["node1"]["vars"]["ddplab_node_rank"] = "one"
    assert '"one" (a string); an integer >= 0' in one_error(inv, "ddplab_node_rank")


def test_limited_out_host_keeps_its_rank_and_address(shards):  # noqa: F811
    """The role's column form: a host outside the play has no collected settings, only rank and address."""
    inv = inventory(shards)
    cols = {"playbook_dir": inv["playbook_dir"], "groups": inv["groups"], "play_hosts": ["node0"],
            "given": {"node0": inv["hosts"]["node0"]["vars"], "node1": None},
            "node_rank": {"node0": 0, "node1": 0}, "addr": {"node0": None, "node1": "any"},
            "ansible_host": {"node0": "10.9.0.10", "node1": "10.9.0.11"},
            "ansible_connection": {"node0": "ssh", "node1": "ssh"}}
    found = errors(cols)
    subjects = [ln.split(" (")[0].removeprefix("ddplab: error: ") for ln in found]
    assert subjects == ["ddplab_node_rank", "ddplab_addr"], found


@pytest.mark.parametrize(("addr", "found"), [
    ("any", '"any"'), ("0.0.0.0/0", '"0.0.0.0/0"'), ("10.9.0.0/24", '"10.9.0.0/24"'),
    ("::1", "IPv6"), ("127.0.0.1", "is not reachable from other machines"),
    ("localhost", "is not reachable from other machines"), ("0.0.0.0", "is not reachable"),
    ("no-such-host.invalid", "does not resolve"), ("10.9.0.10", "10.9.0.10 is used by 2 nodes"),
])
def test_addresses(shards, addr, found):  # noqa: F811
    inv = inventory(shards)
    inv["hosts"]["node1"]["vars"]["ddplab_addr"] = addr
    assert found in one_error(inv, "ddplab_addr")


def test_address_falls_back_to_ansible_host_then_name(shards):  # noqa: F811
    inv = inventory(shards)
    inv["hosts"]["node1"]["ansible_host"] = None  # the name node1 does not resolve
    assert '"node1" does not resolve' in one_error(inv, "ddplab_addr")
    inv["hosts"]["node1"]["ansible_host"] = "127.0.0.1"
    assert "not reachable" in one_error(inv, "ddplab_addr")


def test_loopback_and_shared_addresses_when_every_node_is_local(shards):  # noqa: F811
    inv = inventory(shards, connection="local", ddplab_addr="127.0.0.1")
    assert lines(inv) == []


def test_the_local_inventory_passes(shards):  # noqa: F811
    assert errors(inventory(shards, connection="local", ddplab_addr="localhost")) == []


def test_the_example_inventory_is_valid(shards):  # noqa: F811
    """inventory/example/hosts.yml as a user copies it (with shards): no error, no warning."""
    import yaml
    from settings_helpers import REPO

    example = yaml.safe_load((REPO / "inventory" / "example" / "hosts.yml").read_text())
    tree = example["ddplab_nodes"]["children"]
    groups = {g: list(tree[g]["hosts"]) for g in ("ddplab_master", "ddplab_workers")}
    groups["ddplab_nodes"] = groups["ddplab_master"] + groups["ddplab_workers"]
    hosts = {}
    for g in ("ddplab_master", "ddplab_workers"):
        for name, hv in tree[g]["hosts"].items():
            given = {k: v for k, v in hv.items() if k.startswith("ddplab_")}
            given["ddplab_data_dir"] = str(shards)
            hosts[name] = {"vars": given, "ansible_host": hv["ansible_host"]}
    inv = {"groups": groups, "hosts": hosts, "playbook_dir": str(REPO / "playbooks")}
    assert lines(inv) == []
