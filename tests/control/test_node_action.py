"""plugins/action/ddplab_node.py: a command on the node without the command module's wrapper gives the
command module's answer (rc, stdout and stderr apart, trailing newlines stripped, stdin with a newline,
chdir, the task's environment, argv quoted, cmd split without a shell, check mode skipped), on the local
connection and over real SSH to a simulated host (where a missing stdin would bring a terminal that
merges stderr into stdout); and ad hoc, as `make wheelhouse INV=...` reads the nodes' Pythons with it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from ddplab import wheelhouse as wh
from ddplab.node_command import shipped_program
from tests.helpers.playbooks import BIN, REPO

PLAY = textwrap.dedent("""\
    - hosts: all
      gather_facts: false
      tasks:
        - name: make the folder
          ddplab_node:
            argv: [mkdir, -p, "{{ folder }}"]
          check_mode: false

        - name: argv, stdin, chdir with a space, the task's environment
          ddplab_node:
            argv: [/bin/sh, -c, 'read -r x; printf "%s|%s|%s\\n\\n" "$x" "$(pwd)" "$DDPLAB_T"; echo oops >&2']
            stdin: "{{ word }}"
            chdir: "{{ folder }}"
          environment:
            DDPLAB_T: "a b"
          register: one
          check_mode: false

        - name: cmd is split without a shell, an argument with a quote stays one argument
          ddplab_node:
            cmd: printf '%s;' "it's one" $HOME
          register: two
          check_mode: false

        - name: a non-zero exit fails the task
          ddplab_node:
            argv: [/bin/sh, -c, "exit 3"]
          register: three
          failed_when: false
          check_mode: false

        - name: in check mode the command does not run
          ddplab_node:
            argv: [touch, "{{ folder }}/ran"]
          register: four

        - name: hand the results over
          ansible.builtin.debug:
            msg: "RESULTS {{ {'one': one, 'two': two, 'three': three, 'four': four} | to_json }}"
    """)


def run_play(tmp_path, inventory: list[str], folder, check: bool) -> dict:
    (tmp_path / "play.yml").write_text(PLAY)
    argv = [str(BIN / "ansible-playbook"), str(tmp_path / "play.yml"), *inventory,
            "-e", json.dumps({"word": "hello world", "folder": str(folder)})] + (["--check"] if check else [])
    env = {"ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:/usr/bin:/bin"}
    proc = subprocess.run(argv, cwd=REPO, text=True, capture_output=True, timeout=120,
                          stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if "RESULTS " in ln)
    return json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"].removeprefix("RESULTS "))


def check_results(res: dict, folder, home: str, exists) -> None:
    one, two, three, four = res["one"], res["two"], res["three"], res["four"]
    assert one["rc"] == 0 and one["stdout"] == f"hello world|{folder}|a b", one
    assert one["stderr"] == "oops" and one["stdout_lines"] == [one["stdout"]], one
    assert two["stdout"] == f"it's one;{home};" and two["cmd"] == ["printf", "%s;", "it's one", "$HOME"], two
    assert three["rc"] == 3 and three["failed"] is False and three["msg"] == "non-zero return code", three
    assert four.get("skipped") is True and not exists(f"{folder}/ran"), four


def test_local_connection(tmp_path):
    folder = tmp_path / "a folder"
    local = ["-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=/usr/bin/python3"]
    res = run_play(tmp_path, local, folder, check=True)
    check_results(res, folder, home="$HOME", exists=lambda p: Path(p).exists())  # cmd: $HOME stays as typed


@pytest.mark.simlan
def test_over_ssh_on_a_simulated_host(simlan2, tmp_path):
    folder = "/root/ddplab node action/a folder"  # on node1 (its /tmp is its own)
    try:
        res = run_play(tmp_path, ["-i", str(simlan2.inventory_dir), "-l", "node1"], folder, check=True)
        check_results(res, folder, home="$HOME",
                      exists=lambda p: simlan2.exec("node1", ["test", "-e", p], timeout=30).returncode == 0)
    finally:
        simlan2.exec("node1", ["rm", "-rf", "/root/ddplab node action"], timeout=30)


@pytest.mark.simlan
def test_fill_reads_each_nodes_python_the_one_way(simlan2, tmp_path):
    """Each node's python3 answers with nodeprobe's site-probe, run as all node code runs (the ddplab_node
    action, `python3 -I`): a platform.py in the login's home (a user's script) is not imported. The old ad-hoc
    `python3 -c "import platform ..."` through the command module imported it and failed the node. A node
    that does not answer is named, with the fix."""
    ansible = str(BIN / "ansible")
    probe = REPO / "nodeprobe" / "site_probe.py"
    here = json.loads(subprocess.run(["python3", "-I", str(probe)], capture_output=True, text=True,
                                     check=True, timeout=30).stdout)["platform"].split()  # the nodes' python3
    planted = "echo 'raise SystemExit(\"the home platform.py\")' > /root/platform.py"
    simlan2.exec("node1", ["sh", "-c", planted], timeout=30, check=True)
    try:
        assert wh.node_pythons(str(simlan2.inventory_dir), ansible) == {tuple(here)}
    finally:
        simlan2.exec("node1", ["rm", "-f", "/root/platform.py"], timeout=30)
    inventory = tmp_path / "inv"
    shutil.copytree(simlan2.inventory_dir, inventory)
    (inventory / "ghost.yml").write_text(
        "ddplab_nodes:\n  hosts:\n    ghost: {ansible_host: 127.0.0.1, ansible_port: 1}\n")
    with pytest.raises(wh.WheelhouseError) as e:
        wh.node_pythons(str(inventory), ansible)
    assert str(e.value) == (f"{inventory}: could not read the Python version of ghost; every node must "
                            "answer over SSH with python3; fix the node or pass --python")


def outside_ansible(folder: Path) -> Path:
    """An ansible installed outside ddplab's venv: a venv that sees the same ansible packages but not
    ddplab (a plain path in a .pth: that folder's own .pth files, ddplab's editable install, are not read)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    (next(folder.glob("lib/python3*/site-packages")) / "ansible-only.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    ansible = folder / "bin" / "ansible"
    ansible.write_text(f"#!{folder}/bin/python\nimport sys\nfrom ansible.cli.adhoc import main\n"
                       "sys.exit(main())\n")
    ansible.chmod(0o755)
    return ansible


def test_fill_reads_the_nodes_with_an_ansible_outside_ddplabs_venv(tmp_path):
    """`wheelhouse fill --ansible PATH`: the ddplab_node action imports ddplab, which an ansible of its own
    venv (pipx, the distribution's) cannot import by itself (the old fill said the nodes did not answer).
    An ansible that cannot run at all is one message naming the fix, no traceback."""
    ansible = outside_ansible(tmp_path / "venv")
    alone = subprocess.run([tmp_path / "venv" / "bin" / "python", "-c", "import ansible.cli.adhoc, ddplab"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert "No module named 'ddplab'" in alone.stderr  # that ansible's Python has ansible, not ddplab
    inventory = tmp_path / "inv"
    inventory.mkdir()
    (inventory / "hosts.yml").write_text("ddplab_nodes:\n  hosts:\n    localhost: "
                                         "{ansible_connection: local}\n")
    here = json.loads(subprocess.run(["python3", "-I", str(REPO / "nodeprobe" / "site_probe.py")],
                                     capture_output=True, text=True, check=True, timeout=30).stdout)
    assert wh.node_pythons(str(inventory), str(ansible)) == {tuple(here["platform"].split())}
    proc = subprocess.run([sys.executable, "-m", "ddplab.wheelhouse", "fill", "--dir", str(tmp_path / "wh"),
                           "-i", str(inventory), "--ansible", str(tmp_path / "no-ansible")], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == (
        f"ddplab: error: --ansible {tmp_path}/no-ansible: cannot run it (No such file or directory); "
        f"fix: name an ansible command, or leave --ansible out to use ddplab's ({wh.DEFAULT_ANSIBLE})\n"), \
        proc.stderr


NODEPROBE_PLAY = textwrap.dedent("""\
    - hosts: all
      gather_facts: false
      vars:
        ddplab_lab: {code: "{{ repo }}", python_file: "{{ tmp }}/python"}
      tasks:
        - name: a module shipped alone (the program on stdin, no synced code needed)
          ddplab_node:
            nodeprobe: hashing
            argv: [tree-json, "{{ tmp }}/tree"]
          register: alone
          check_mode: false

        - name: a verb of the synced code, its data on stdin as JSON
          ddplab_node:
            nodeprobe: place-files
            stdin: {files: [{path: "{{ tmp }}/placed.txt", mode: "0600", content: "hi"}]}
          register: synced
          check_mode: false

        - name: a verb that needs the pinned Python, on a lab whose record names none
          ddplab_node:
            nodeprobe: preflight-connect
          register: unprepared
          failed_when: false
          check_mode: false

        - name: the same verb in a lab folder given as ~/..., whose record names a Python without torch
          ddplab_node:
            nodeprobe: preflight-connect
            lab: "~/{{ lab_in_home }}"
          register: other_lab
          failed_when: false
          check_mode: false

        - name: hand the results over
          ansible.builtin.debug:
            msg: "RESULTS {{ {'alone': alone, 'synced': synced, 'unprepared': unprepared, 'other': other_lab}
              | to_json }}"
    """)


def test_nodeprobe_verbs_choose_python_and_code_folder(tmp_path):
    """ddplab_node's `nodeprobe:` is the one way roles run node code: a module shipped alone runs from stdin,
    a verb of the synced code runs in the lab's code folder (its stdin data as JSON), a torch verb with the
    Python the lab's record names, and a node without one says it is not prepared (exit 3, one line)."""
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "a.txt").write_text("a\n")
    (tmp_path / "tree" / ".ddplab-sync-files.json").write_text('["a.txt"]')  # what ddplab placed there
    home = Path.home()
    lab = home / f".ddplab-node-action-{tmp_path.name}"
    (lab / "code").mkdir(parents=True)
    try:
        (lab / "code" / "nodeprobe").symlink_to(REPO / "nodeprobe")
        (lab / "python").write_text("/bin/false\n")  # a Python that says nothing and fails
        (tmp_path / "play.yml").write_text(NODEPROBE_PLAY)
        argv = [str(BIN / "ansible-playbook"), str(tmp_path / "play.yml"), "-i", "localhost,", "-c", "local",
                "-e", json.dumps({"repo": str(REPO), "tmp": str(tmp_path), "lab_in_home": lab.name,
                                  "ansible_python_interpreter": sys.executable})]
        env = {"ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(home)}
        proc = subprocess.run(argv, cwd=REPO, text=True, capture_output=True, timeout=120,
                              stdin=subprocess.DEVNULL, env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    finally:
        subprocess.run(["rm", "-rf", str(lab)], check=True)
    line = next(ln for ln in proc.stdout.splitlines() if "RESULTS " in ln)
    res = json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"].removeprefix("RESULTS "))
    assert res["alone"]["cmd"][:3] == [sys.executable, "-I", "-c"], res["alone"]
    length = str(len(shipped_program("hashing")))
    assert res["alone"]["cmd"][4:] == [length, "tree-json", f"{tmp_path}/tree"], res["alone"]
    assert json.loads(res["alone"]["stdout"])[0].endswith("  a.txt"), res["alone"]
    assert res["synced"]["rc"] == 0 and (tmp_path / "placed.txt").read_text() == "hi\n", res["synced"]
    assert oct((tmp_path / "placed.txt").stat().st_mode & 0o777) == "0o600"
    assert res["unprepared"]["rc"] == 3 and res["unprepared"]["stderr"].startswith(
        f"ddplab: error: this node is not prepared: {tmp_path}/python names no Python (its python3: 3."), \
        res["unprepared"]
    assert res["unprepared"]["stderr"].endswith("); fix: run playbooks/prepare.yml"), res["unprepared"]
    # ~ is the node's home; the record's Python is the one that runs (here /bin/false: rc 1, no output)
    assert res["other"]["rc"] == 1 and res["other"]["stderr"] == "", res["other"]
