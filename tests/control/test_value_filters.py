"""The filters that keep logic out of the roles' Jinja: plugins/filter/ddplab_answer.py (what a failed command
said), roles/code_sync/filter_plugins/push_plan.py (the code sync's trees and the names it sends) and
roles/lab_facts/filter_plugins/lab_facts.py (addresses, lab folders, the run's hosts)."""

import importlib.util

from tests.helpers.playbooks import REPO


def load(path: str):
    spec = importlib.util.spec_from_file_location(path.rsplit("/", 1)[-1][:-3], REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


answer = load("plugins/filter/ddplab_answer.py")
push_plan = load("roles/code_sync/filter_plugins/push_plan.py")
lab_facts = load("roles/lab_facts/filter_plugins/lab_facts.py")


def test_stderr_tail_is_the_last_line_a_failed_command_said():
    assert answer.stderr_tail({"rc": 3, "stderr": "Traceback\n  ...\nddplab: error: not prepared\n"}) == \
        ": ddplab: error: not prepared"
    assert answer.stderr_tail({"rc": 0, "stderr": "a warning"}) == ""
    assert answer.stderr_tail({"rc": 1, "stderr": "  "}) == "" and answer.stderr_tail(None) == ""


def test_failure_is_the_commands_own_message_else_what_failed():
    assert answer.failure({"rc": 2, "stderr": "ddplab: error: no room on node1\n"}, "sending x") == \
        "ddplab: error: no room on node1"
    assert answer.failure({"rc": 2, "stderr": "", "msg": "timed out"}, "sending x to node1") == \
        "ddplab: error: sending x to node1 failed: timed out"
    assert answer.failure({}, "relaying x") == "ddplab: error: relaying x failed: no output"


def test_sync_trees_are_the_labs_then_the_users_code():
    lab = [{"src": "/r/trainer", "dest": "trainer"}]
    assert push_plan.sync_trees(lab, "", "user", []) == [{**lab[0], "mode": "all"}]
    assert push_plan.sync_trees(lab, "/home/me/code", "user", ["data/*.txt"])[1] == {
        "src": "/home/me/code", "dest": "user", "mode": "gitignore", "include": ["data/*.txt"]}


def test_push_dests_are_names_then_dests():
    assert push_plan.push_dests(["a.whl", {"src": "/c/b", "dest": "data/b"}, "c.whl"]) == \
        ["a.whl", "c.whl", "data/b"]
    assert push_plan.push_dests(None) == []


def test_lab_addrs_home_paths_and_run_hosts():
    hostvars = {"n0": {"ddplab_addr": "10.0.0.5", "ansible_host": "n0.lan", "ddplab_node_rank": 0},
                "n1": {"ddplab_addr": "", "ansible_host": "n1.lan", "ddplab_node_rank": "1"},
                "n2": {"ddplab_node_rank": 2}}
    nodes = ["n0", "n1", "n2"]
    assert lab_facts.lab_addrs(nodes, hostvars) == {"n0": "10.0.0.5", "n1": "n1.lan", "n2": "n2"}
    assert lab_facts.home_path("~/ddplab//", "/home/me") == "/home/me/ddplab"
    assert lab_facts.home_path("~", "/root") == "/root" and lab_facts.home_path("/srv/~x/", "/h") == "/srv/~x"
    assert lab_facts.home_path("~bob/x", "/h") == "~bob/x"  # only the user's own ~
    assert lab_facts.run_hosts(nodes, hostvars, "tmux", 2) == nodes
    assert lab_facts.run_hosts(nodes, hostvars, "slurm", "0") == nodes
    assert lab_facts.run_hosts(nodes, hostvars, "slurm", "2") == ["n0", "n1"]


def test_known_home_is_the_first_read_that_answered():
    """lab_facts reads the home folder only when no step of the command did: its own read, preflight's SSH
    check, a relaunch's ready probe (its JSON); a skipped, failed or unreachable result is no answer."""
    ready = {"rc": 0, "stdout": '{"probe": "ready", "ready": true, "why": "", "home": "/home/r"}'}
    skipped = {"skipped": True, "changed": False}
    assert lab_facts.known_home({"plan_ready": ready}) == "/home/r"
    assert lab_facts.known_home({"lab_facts_home": skipped, "preflight_ssh": {"rc": 0, "stdout": "/home/p"},
                                 "plan_ready": ready}) == "/home/p"
    own = {"rc": 0, "stdout": "/home/o"}
    assert lab_facts.known_home({"lab_facts_home": own, "plan_ready": ready}) == "/home/o"
    gone = {"unreachable": True, "msg": "x"}
    assert lab_facts.known_home({"preflight_ssh": gone, "plan_ready": ready}) == "/home/r"
    for none in ({}, {"plan_ready": skipped}, {"plan_ready": {"rc": 0, "stdout": "not json"}},
                 {"plan_ready": {"rc": 1, "stdout": ready["stdout"]}}, {"plan_ready": {"unreachable": True}},
                 {"plan_ready": {"rc": 0, "stdout": '{"probe": "ready", "written": "/x"}'}}):
        assert lab_facts.known_home(none) == "", none


pip_wheels = load("roles/torch_env/filter_plugins/pip_wheels.py")


def test_wheels_to_push_are_those_missing_or_different_on_the_node():
    files = [{"file": f"{n}.whl", "sha256": n * 2} for n in "abc"]
    have = ["aa  a.whl", "xx *b.whl"]  # c.whl missing (sha256sum said so on stderr), b.whl other bytes
    assert [f["file"] for f in pip_wheels.wheels_to_push(files, have)] == ["b.whl", "c.whl"]
    assert pip_wheels.wheels_to_push(files, None) == files


def test_pip_install_offline_by_hashes_or_from_the_index_given():
    assert pip_wheels.pip_install("/v/bin/python", "/l/constraints.txt", wheelhouse="/l/wheels") == [
        "/v/bin/python", "-I", "-m", "pip", "install", "--disable-pip-version-check", "--no-index",
        "--find-links", "/l/wheels", "--require-hashes", "-r", "/dev/stdin", "-c", "/l/constraints.txt"]
    assert pip_wheels.pip_install("py", "c.txt", requirements="r.txt", index_url="", find_links="/w",
                                  extra_index_url="https://x")[6:] == [
        "-r", "r.txt", "-c", "c.txt", "--find-links", "/w", "--extra-index-url", "https://x"]
    assert pip_wheels.pip_install("py", "", wheelhouse="/w")[-2:] == ["-r", "/dev/stdin"]  # no constraints
    assert pip_wheels.venv_create("py", "/v") == ["py", "-I", "-m", "venv", "--without-pip", "/v"]


slurm_answers = load("roles/slurm/filter_plugins/slurm_answers.py")


def test_the_slurm_helpers_answers_read():
    said = '{"made": false, "moved": ["runs/.slurm/munge.key -> ~/.config/x"], "left": ["kept"]}'
    assert slurm_answers.secrets_notes(said) == ["moved the munge key: runs/.slurm/munge.key -> ~/.config/x",
                                                 "note: kept"]
    assert slurm_answers.secrets_notes('{"made": true, "moved": [], "left": []}') == []
    assert slurm_answers.daemons_changed('{"started": [], "restarted": ["slurmd"], "running": []}')
    assert not slurm_answers.daemons_changed('{"started": [], "restarted": [], "running": ["slurmd"]}')
    assert not slurm_answers.daemons_changed('{"error": "slurmd did not start"}')
    assert not slurm_answers.daemons_changed("Traceback ...")
