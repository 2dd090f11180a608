"""plugins/action/ddplab_fetch.py: a node's file copied to the control host, checked against the SHA-256 the
node printed, then removed from the node, in one task and without a module on the node (roles/logs). A copy
whose checksum differs fails the task, keeps the node's file and leaves no copy; without a checksum, or under
become, ansible.builtin.fetch copies it (stat or slurp), and the node's file is still removed. Over SSH:
tests/orchestrator/test_limit_simlan.py's relaunch runs no module on any node."""

from __future__ import annotations

import hashlib
import json
import subprocess
import textwrap

from tests.helpers.playbooks import BIN, REPO

PLAY = textwrap.dedent("""\
    - hosts: localhost
      gather_facts: false
      tasks:
        - name: checked and removed
          ddplab_fetch:
            src: "{{ node }}/one.tgz"
            dest: "{{ control }}/sub/one.tgz"
            sha256: "{{ sha }}"
            remove: true
          register: one

        - name: a copy that is not what the node wrote
          ddplab_fetch:
            src: "{{ node }}/two.tgz"
            dest: "{{ control }}/two.tgz"
            sha256: "{{ '0' * 64 }}"
            remove: true
          register: two
          ignore_errors: true

        - name: no checksum (a node whose code predates it), under become
          ddplab_fetch:
            src: "{{ node }}/three.tgz"
            dest: "{{ control }}/three.tgz"
            remove: true
          become: true
          register: three

        - name: check mode
          ddplab_fetch:
            src: "{{ node }}/four.tgz"
            dest: "{{ control }}/four.tgz"
            remove: true
          check_mode: true
          register: four

        - name: hand the results over
          ansible.builtin.debug:
            msg: "RESULTS {{ {'one': one, 'two': two, 'three': three, 'four': four} | to_json }}"
    """)


def test_fetch_checks_the_copy_and_removes_the_nodes_file(tmp_path):
    node, control = tmp_path / "node", tmp_path / "control"
    node.mkdir()
    data = {name: f"{name} bytes \x00\xff".encode("latin-1") for name in ("one", "two", "three", "four")}
    for name, content in data.items():
        (node / f"{name}.tgz").write_bytes(content)
    (tmp_path / "play.yml").write_text(PLAY)
    extra = {"node": str(node), "control": str(control), "sha": hashlib.sha256(data["one"]).hexdigest()}
    proc = subprocess.run([str(BIN / "ansible-playbook"), str(tmp_path / "play.yml"), "-i", "localhost,",
                           "-c", "local", "-e", json.dumps(extra), "-vvv"], cwd=REPO, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={"ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if "RESULTS " in ln)
    res = json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"].removeprefix("RESULTS "))
    one, two, three, four = res["one"], res["two"], res["three"], res["four"]
    assert (control / "sub" / "one.tgz").read_bytes() == data["one"] and not (node / "one.tgz").exists()
    assert one["changed"] and one["sha256"] == extra["sha"], one
    assert two["failed"] and "has SHA-256" in two["msg"] and "left there" in two["msg"], two
    assert (node / "two.tgz").read_bytes() == data["two"] and not (control / "two.tgz").exists()
    assert (control / "three.tgz").read_bytes() == data["three"] and not (node / "three.tgz").exists()
    assert three["sha256"] == hashlib.sha256(data["three"]).hexdigest(), three
    assert four.get("skipped") and (node / "four.tgz").exists() and not (control / "four.tgz").exists()
    # only the task without a checksum ran a module (fetch's stat) on the node
    assert proc.stdout.count("Using module file") == 1, proc.stdout[-3000:]
