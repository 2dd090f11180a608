"""Each setting's type, range and choices: the bad value, its neighbours, and the values that must pass."""

import pytest
from settings_helpers import errors, inventory, one_error, shards  # noqa: F401

from ddplab.settings.spec import SETTINGS
from ddplab.settings.values import coerce

BAD = [
    # (setting, value): zero, negative, too large, wrong type, empty string, a dict or string for a list
    ("ddplab_trainer_steps", "-5"), ("ddplab_trainer_steps", 0), ("ddplab_trainer_steps", "abc"),
    ("ddplab_trainer_steps", ""), ("ddplab_trainer_steps", 2.5), ("ddplab_trainer_steps", True),
    ("ddplab_trainer_steps", [5]), ("ddplab_trainer_depth", "abc"), ("ddplab_trainer_depth", 0),
    ("ddplab_trainer_depth", -1), ("ddplab_nproc_per_node", 0), ("ddplab_nproc_per_node", "-1"),
    ("ddplab_nproc_per_node", 100000), ("ddplab_master_port", 99999), ("ddplab_master_port", 0),
    ("ddplab_master_port", 65536), ("ddplab_master_port", "-1"), ("ddplab_master_port", "http"),
    ("ddplab_threads", -1), ("ddplab_rdzv_timeout", 0), ("ddplab_pg_timeout", -3),
    ("ddplab_wait_timeout", 0), ("ddplab_wait_poll", "0"), ("ddplab_max_restarts", -1),
    ("ddplab_wait", "maybe"), ("ddplab_wait", ""), ("ddplab_wait", 2), ("ddplab_wait", [True]),
    ("ddplab_resume", "sometimes"), ("ddplab_strict", "perhaps"),
    ("ddplab_entrypoint_args", "--depth=4"), ("ddplab_entrypoint_args", {"depth": 4}),
    ("ddplab_entrypoint_args", [["--depth", 4]]), ("ddplab_trainer_extra_args", "--batch-size 8"),
    ("ddplab_trainer_extra_args", {"--batch-size": 8}), ("ddplab_collect_globs", "**/*.json"),
    ("ddplab_collect_globs", None), ("ddplab_env", ["A=1"]), ("ddplab_env", "A=1"),
    ("ddplab_env", {"A": {"nested": 1}}), ("ddplab_run_id", "bad id"), ("ddplab_run_id", "-x"),
    ("ddplab_run_id", "a" * 65), ("ddplab_root", "relative/lab"), ("ddplab_root", ["~/ddplab"]),
    ("ddplab_root", "~"), ("ddplab_root", "~/"), ("ddplab_root", "/"), ("ddplab_root", "//"),
    ("ddplab_torch_version", "latest"), ("ddplab_torch_version", "2.13"[:1] + "x"),
    ("ddplab_code_subdir", "trainer"), ("ddplab_code_subdir", "a/b"), ("ddplab_code_subdir", ".."),
    ("ddplab_pip_index_url", "not a url"), ("ddplab_data_dir", {"path": "x"}),
]


@pytest.mark.parametrize(("name", "value"), BAD, ids=[f"{n}={v!r}"[:60] for n, v in BAD])
def test_bad_value_is_one_error_naming_the_setting(shards, name, value):  # noqa: F811
    line = one_error(inventory(shards, **{name: value}), name)
    assert "(all)" in line


@pytest.mark.parametrize(("name", "value"), [
    ("ddplab_trainer_steps", "7"), ("ddplab_trainer_steps", 7), ("ddplab_master_port", "1"),
    ("ddplab_master_port", 65535), ("ddplab_wait", "yes"), ("ddplab_wait", "False"), ("ddplab_wait", True),
    ("ddplab_wait", 0), ("ddplab_threads", 0), ("ddplab_max_restarts", 0), ("ddplab_run_id", "run-1.a_b"),
    ("ddplab_root", "/srv/lab"), ("ddplab_root", "~/lab"), ("ddplab_python", None),
    ("ddplab_env", {"OMP_PROC_BIND": "close", "N": 3}), ("ddplab_trainer_extra_args", ["--batch-size", 8]),
    ("ddplab_torch_version", "2.13.0"), ("ddplab_code_subdir", "mycode"),
])
def test_good_value_passes(shards, name, value):  # noqa: F811
    assert errors(inventory(shards, **{name: value})) == []


def test_string_list_message_shows_the_list_to_write(shards):  # noqa: F811
    line = one_error(inventory(shards, ddplab_entrypoint_args="--depth=4", ddplab_entrypoint="-m x",
                               ddplab_code_dir=str(shards)), "ddplab_entrypoint_args")
    assert '"--depth=4" (a string); a list of strings' in line
    assert """-e '{"ddplab_entrypoint_args": ["--depth=4"]}'""" in line


def test_bool_message_names_the_allowed_words(shards):  # noqa: F811
    line = one_error(inventory(shards, ddplab_wait="maybe"), "ddplab_wait")
    assert line == ('ddplab: error: ddplab_wait (all): "maybe" (a string); true or false (also yes/no, '
                    'on/off, 1/0); set ddplab_wait in group_vars/all/ or with -e ddplab_wait=VALUE '
                    '(default: false)')


def test_port_message(shards):  # noqa: F811
    line = one_error(inventory(shards, ddplab_master_port="99999"), "ddplab_master_port")
    assert "(all): 99999; an integer in 1..65535;" in line


def test_value_bad_on_one_host_names_that_host(shards):  # noqa: F811
    inv = inventory(shards, nodes=3)
    inv["hosts"]["node2"]["vars"]["ddplab_threads"] = "many"
    line = one_error(inv, "ddplab_threads")
    assert line.startswith("ddplab: error: ddplab_threads (node2):")


def test_run_wide_setting_that_differs_between_hosts(shards):  # noqa: F811
    inv = inventory(shards)
    inv["hosts"]["node1"]["vars"]["ddplab_trainer_steps"] = 9
    line = one_error(inv, "ddplab_trainer_steps")
    assert "differs between hosts (node0=50, node1=9)" in line


def test_per_host_setting_may_differ(shards):  # noqa: F811
    inv = inventory(shards)
    inv["hosts"]["node1"]["vars"]["ddplab_threads"] = 3
    inv["hosts"]["node1"]["vars"]["ddplab_env"] = {"X": "1"}
    assert errors(inv) == []


def _neighbours(s):
    """(value, ok) pairs at the edges of a setting's type and range."""
    if s.kind == "int":
        out = [(str(s.min - 1), False), (s.min, True), (str(s.min), True)] if s.min is not None else []
        out += [(s.max + 1, False), (s.max, True)] if s.max is not None else []
        return out + [("x", False), ("", False), (1.5, False), (True, False), ([1], False), ({"a": 1}, False)]
    if s.kind == "bool":
        return [("maybe", False), ("", False), (2, False), (None, False), ("on", True), ("NO", True)]
    if s.kind == "list" and s.elements == "dict":
        return [("a", False), (["a"], False), ([{"src": "a"}], False), ([{"src": "a", "dest": ["b"]}], False),
                (None, False), ([], True), ([{"src": "a", "dest": "b"}], True)]
    if s.kind == "list":
        return [("a", False), ({"a": "b"}, False), ([{"a": "b"}], False), (None, False), ([], True)]
    if s.kind == "dict":
        return [(["a"], False), ("a=1", False), ({"A": ["x"]}, False), ({}, True)]
    return [(["x"], False), ({"a": "b"}, False), (True, False)]


@pytest.mark.parametrize("setting", SETTINGS, ids=[s.name for s in SETTINGS])
def test_every_setting_at_its_edges(setting):
    for value, ok in _neighbours(setting):
        _, problem = coerce(setting, value)
        assert (problem is None) == ok, (setting.name, value, problem)
        if problem:
            assert problem.subject == setting.name and problem.allowed == setting.allowed()


def test_jinja_defaults_render_like_ansible():
    from ddplab.settings.validate import _render, resolve

    values, problems = resolve({}, "/srv/ddplab/playbooks")
    assert problems == []
    assert (values["ddplab_repo_dir"], values["ddplab_data_dir"], values["ddplab_runs_dir"]) == \
        ("/srv/ddplab", "/srv/ddplab/data/shards", "/srv/ddplab/runs")
    with pytest.raises(ValueError, match="more Jinja"):
        _render("{{ a | upper }}", {"a": "x"})
