"""Unknown ddplab_* names: an error with the closest known name, a warning with ddplab_strict: false."""

import pytest
from settings_helpers import inventory, lines, one_error, shards  # noqa: F401

from ddplab.settings.spec import INTERNAL


@pytest.mark.parametrize(("typo", "meant"), [
    ("ddplab_trainer_stpes", "ddplab_trainer_steps"), ("ddplab_master_prot", "ddplab_master_port"),
    ("ddplab_nproc_per_nodes", "ddplab_nproc_per_node"), ("ddplab_entry_point", "ddplab_entrypoint"),
    ("ddplab_datadir", "ddplab_data_dir"), ("ddplab_torch", "ddplab_torch_version"),
])
def test_typo_names_the_closest_setting(shards, typo, meant):  # noqa: F811
    line = one_error(inventory(shards, **{typo: 3}), typo)
    assert f"{typo} is not a ddplab setting;" in line and line.endswith(f"did you mean {meant}?")


def test_far_name_gets_no_suggestion(shards):  # noqa: F811
    line = one_error(inventory(shards, ddplab_xyzzy=1), "ddplab_xyzzy")
    assert "did you mean" not in line


@pytest.mark.parametrize("strict", [False, "no", "false"])
def test_not_strict_is_a_warning(shards, strict):  # noqa: F811
    out = lines(inventory(shards, ddplab_trainer_stpes=3, ddplab_strict=strict))
    assert out == ["ddplab: warning: ddplab_trainer_stpes (all): ddplab_trainer_stpes is not a ddplab "
                   "setting; the settings documented in inventory/example/group_vars/all/; did you mean "
                   "ddplab_trainer_steps?"]


def test_not_strict_keeps_other_errors(shards):  # noqa: F811
    out = lines(inventory(shards, ddplab_trainer_stpes=3, ddplab_strict=False, ddplab_wait="maybe"))
    assert [ln.split(" (")[0] for ln in out] == ["ddplab: error: ddplab_wait",
                                                 "ddplab: warning: ddplab_trainer_stpes"]


def test_internal_facts_are_never_reported(shards):  # noqa: F811
    assert lines(inventory(shards, **{name: "x" for name in INTERNAL})) == []


def test_typo_on_one_host_only(shards):  # noqa: F811
    inv = inventory(shards)
    inv["hosts"]["node1"]["vars"]["ddplab_thread"] = 2
    assert "did you mean ddplab_threads?" in one_error(inv, "ddplab_thread")
