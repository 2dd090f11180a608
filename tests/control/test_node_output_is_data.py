"""docs/security.md, a compromised node against the control host: whatever a node prints is data on the
control host, never a template. ddplab reads node output the same way everywhere (a node program's stdout
through `from_json` into a fact, passed to a control verb on stdin, shown with `debug`, written with
`copy`); ansible-core 2.19 marks a task's result as untrusted, so Jinja in it is never rendered. Here a
"node" (the local connection, a real node program) prints a pipe lookup that would create a file on the
control host if anything rendered it; the playbook uses the real ddplab_node and ddplab_control plugins."""

from __future__ import annotations

import subprocess
import textwrap

from tests.helpers.playbooks import BIN, REPO

PLAY = textwrap.dedent("""\
    - hosts: all
      gather_facts: false
      tasks:
        - name: the node's program prints its state
          ddplab_node:
            argv: ["{{ ansible_playbook_python }}", "{{ node_program }}"]
          register: polled

        - name: its state becomes a fact
          ansible.builtin.set_fact:
            state: "{{ polled.stdout | from_json }}"

        - name: a control verb reads it on stdin
          ddplab_control:
            argv: [cat]
            stdin: "{{ state | to_json }}"
          register: judged

        - name: the verdict is shown
          ansible.builtin.debug:
            msg: "{{ (judged.stdout | from_json).last_line }}"

        - name: and written to a file on the control host
          ansible.builtin.copy:
            content: "{{ state.last_line }}"
            dest: "{{ out_file }}"
            mode: "0600"
          delegate_to: localhost
""")


def test_jinja_printed_by_a_node_is_never_rendered_on_the_control_host(tmp_path):
    planted = tmp_path / "rendered-by-the-control-host"
    lookup = "{{ lookup('pipe', 'touch " + str(planted) + "') }}"
    # the node's program holds the words; Ansible reads only its path
    node_program = tmp_path / "node_state.py"
    node_program.write_text(f"import json\nprint(json.dumps({{'last_line': {lookup!r}}}))\n")
    (tmp_path / "play.yml").write_text(PLAY)
    out_file = tmp_path / "last_line.txt"
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"),
         "-e", f"node_program={node_program}", "-e", f"out_file={out_file}",
         "-e", f"ansible_python_interpreter={BIN / 'python'}"],
        cwd=REPO, text=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not planted.exists(), "the control host rendered a template a node printed"
    assert out_file.read_text() == lookup, "the node's words did not arrive as they were"
    assert lookup in proc.stdout
