"""plugins/action/ddplab_wait.py: the wait of a run in one task per node. A node command that answers like
`nodeprobe run-status` (running for a few polls, then exited) is asked again with `--wait POLL` until the
state is final, with one progress line per poll; `max_polls` ends the wait as timed out; a command that
fails or prints no JSON fails the task; a node that does not answer over SSH is `gone` when `gone_ok`
(elastic), else unreachable (a closed port on loopback stands for the host that died)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.helpers.playbooks import BIN, REPO

# Answers like run-status: `running` for RUNNING polls, then `exited` with code 0; records each --wait.
STATUS = textwrap.dedent("""\
    import json, sys
    count, running = sys.argv[1], int(sys.argv[2])
    wait = sys.argv[sys.argv.index("--wait") + 1]
    with open(count, "a") as f:
        f.write(wait + "\\n")
    n = len(open(count).read().split())
    if running < 0:
        print("no json here"); sys.exit(3)
    state = "running" if n <= running else "exited"
    print(json.dumps({"state": state, "code": None if state == "running" else 0, "step": n,
                      "progress": f"step {n}/9", "last_line": f"line {n}"}))
    """)

PLAY = textwrap.dedent("""\
    - hosts: localhost
      gather_facts: false
      tasks:
        - name: follow a rank that runs for 3 polls
          ddplab_wait:
            argv: ["{{ python }}", "{{ status }}", "{{ tmp }}/count1", "3"]
            poll: 1
            max_polls: 10
          register: done

        - name: a wait that times out
          ddplab_wait:
            argv: ["{{ python }}", "{{ status }}", "{{ tmp }}/count2", "99"]
            poll: 0
            max_polls: 2
          register: timed

        - name: a node command that fails
          ddplab_wait:
            argv: ["{{ python }}", "{{ status }}", "{{ tmp }}/count3", "-1"]
            poll: 0
            max_polls: 2
          register: broken
          ignore_errors: true

        - name: hand the results over
          ansible.builtin.debug:
            msg: "RESULTS {{ {'done': done, 'timed': timed, 'broken': broken} | to_json }}"

    - hosts: gone
      gather_facts: false
      tasks:
        - name: a node that does not answer, elastic
          ddplab_wait:
            argv: [/bin/true]
            max_polls: 2
            gone_ok: true
          register: gone

        - name: hand the result over
          ansible.builtin.debug:
            msg: "GONE {{ gone | to_json }}"

        - name: the same node, not elastic
          ddplab_wait:
            argv: [/bin/true]
            max_polls: 2
    """)

INVENTORY = textwrap.dedent("""\
    localhost ansible_connection=local
    [gone]
    deadhost ansible_host=127.0.0.1 ansible_port=1 ansible_connection=ssh
    """)


def results(stdout: str, tag: str) -> dict:
    line = next(ln for ln in stdout.splitlines() if f'"msg": "{tag} ' in ln)
    return json.loads(json.loads("{" + line.strip() + "}")["msg"][len(tag) + 1:])


def test_polls_until_the_state_is_final_and_says_timed_out_failed_or_gone(tmp_path):
    (tmp_path / "status.py").write_text(STATUS)
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "hosts").write_text(INVENTORY)
    extra = {"python": sys.executable, "status": str(tmp_path / "status.py"), "tmp": str(tmp_path)}
    argv = [str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts"), str(tmp_path / "play.yml"),
            "-e", json.dumps(extra)]
    env = {"ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:/usr/bin:/bin"}
    proc = subprocess.run(argv, cwd=REPO, env=env, text=True, capture_output=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    out = proc.stdout
    done, timed, broken = (results(out, "RESULTS")[k] for k in ("done", "timed", "broken"))
    # 3 polls running, the 4th exited; each poll asked the node to wait `poll` seconds and printed a line
    assert (done["polls"], done["timed_out"], done["state"]["state"]) == (4, False, "exited")
    assert (tmp_path / "count1").read_text().split() == ["1"] * 4
    lines = [ln for ln in out.splitlines() if ln.startswith("localhost: ")]
    assert lines[:4] == [f"localhost: running step {n}/9 | line {n}" for n in (1, 2, 3)] + [
        "localhost: exited code 0 step 4/9 | line 4"]
    assert (timed["polls"], timed["timed_out"], timed["state"]["state"]) == (2, True, "running")
    assert broken["failed"] and broken["msg"] == "run-status exited with code 3: no json here"
    assert results(out, "GONE")["state"]["state"] == "gone"
    # not elastic: the same node is unreachable, and the play says so
    assert "deadhost                   : ok=2    changed=0    unreachable=1" in out, out[-3000:]
    assert proc.returncode == 4, out[-3000:]
