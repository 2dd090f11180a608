"""plugins/action/ddplab_control.py: a control-side step run from Ansible's worker. A long step shows its
progress file's line while it runs and its last line when it ends (the transfers of roles/code_sync), the
progress file lives in a private folder that is gone afterwards (a file ddplab did not place there stays,
and so does the folder), stdin reaches the command once, and a step that outlives its timeout is stopped
and fails the task."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.playbooks import BIN, REPO

# A step like `ddplab sync-push`: reads its spec on stdin, rewrites --progress FILE with a line, ends.
STEP = textwrap.dedent("""\
    import json, os, sys, time
    spec = json.loads(sys.stdin.read())
    path = sys.argv[sys.argv.index("--progress") + 1]
    open(spec["seen"], "w").write(os.path.dirname(path))
    if spec.get("own"):  # a file ddplab did not place, beside the progress file
        open(os.path.join(os.path.dirname(path), "own.txt"), "w").write(spec["own"])
    for i in range(spec["rounds"]):
        with open(path + ".tmp", "w") as f:
            json.dump({"state": "running", "line": f"round {i}"}, f)
        os.replace(path + ".tmp", path)
        time.sleep(0.5)
    with open(path, "w") as f:
        json.dump({"state": "done", "lines": ["node1 <- node0: sent it", "node2 <- node1: sent it"]}, f)
    print(json.dumps({"stdin_bytes": len(json.dumps(spec))}))
    """)

PLAY = textwrap.dedent("""\
    - hosts: localhost
      gather_facts: false
      tasks:
        - name: a step that reports progress for 2 s
          ddplab_control:
            argv: ["{{ python }}", "{{ step }}"]
            stdin: "{{ {'rounds': 4, 'seen': seen} | to_json }}"
            progress: true
            progress_label: "code to node0"
            progress_every: 0.6
          register: done

        - name: a step stopped by its timeout
          ddplab_control:
            argv: ["{{ python }}", "{{ step }}"]
            stdin: "{{ {'rounds': 100, 'seen': seen ~ '.2'} | to_json }}"
            progress: true
            timeout: 1
          register: stopped
          failed_when: false

        - name: a step that leaves a file of its own in the progress folder
          ddplab_control:
            argv: ["{{ python }}", "{{ step }}"]
            stdin: "{{ {'rounds': 0, 'seen': seen ~ '.3', 'own': 'keep me'} | to_json }}"
            progress: true

        - name: hand the results over
          ansible.builtin.debug:
            msg: "RESULTS {{ {'done': done, 'stopped': stopped} | to_json }}"
    """)


def test_progress_lines_while_it_runs_the_last_at_the_end_and_the_timeout(tmp_path):
    (tmp_path / "step.py").write_text(STEP)
    (tmp_path / "play.yml").write_text(PLAY)
    seen = tmp_path / "seen"
    extra = {"python": sys.executable, "step": str(tmp_path / "step.py"), "seen": str(seen)}
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(tmp_path / "play.yml"), "-e", json.dumps(extra)], cwd=REPO, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={"ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    shown = [ln for ln in proc.stdout.splitlines() if ln.startswith("code to node0: ")]
    running = shown[:-2]  # about one per 0.6 s over the 2 s the step runs
    assert 1 <= len(running) <= 4 and all(ln.startswith("code to node0: round ") for ln in running), shown
    assert shown[-2:] == ["code to node0: node1 <- node0: sent it", "code to node0: node2 <- node1: sent it"]
    line = next(ln for ln in proc.stdout.splitlines() if "RESULTS " in ln)
    res = json.loads(json.loads("{" + line.strip().rstrip(",") + "}")["msg"].removeprefix("RESULTS "))
    done, stopped = res["done"], res["stopped"]
    assert done["rc"] == 0 and json.loads(done["stdout"])["stdin_bytes"] > 0, done
    assert done["progress_lines"] == ["node1 <- node0: sent it", "node2 <- node1: sent it"], done
    folders = [seen.read_text(), (tmp_path / "seen.2").read_text()]
    assert all(f.startswith("/tmp/ddplab-progress-") for f in folders), folders
    assert not any(os.path.exists(f) for f in folders)  # the private folders are gone
    kept = (tmp_path / "seen.3").read_text()  # only the progress file went: the folder and own.txt stay
    try:
        assert sorted(os.listdir(kept)) == ["own.txt"] and Path(kept, "own.txt").read_text() == "keep me"
    finally:
        shutil.rmtree(kept, ignore_errors=True)
    assert stopped["rc"] != 0 and stopped["failed"] is False, stopped
    assert stopped["stderr"].endswith(f"ddplab: error: {sys.executable} was stopped after 1 s"), stopped
    assert len(stopped["progress_lines"]) == 1 and stopped["progress_lines"][0].startswith("round "), stopped
