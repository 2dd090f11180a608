"""nodeprobe launch-facts / start-rank: the launch role's two node steps, run here with a real tmux server
on a private socket (as on a node), through the same `python -m nodeprobe` command line the role uses."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(subprocess.run(["which", "tmux"], capture_output=True).returncode != 0,
                                reason="tmux is not installed")


def probe(verb: str, spec: dict) -> tuple[int, dict | None, str]:
    out = subprocess.run([sys.executable, "-m", "nodeprobe", verb], input=json.dumps(spec), cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    return out.returncode, json.loads(lines[-1]) if lines else None, out.stderr


@pytest.fixture
def lab(tmp_path):
    root = tmp_path / "lab"
    (root / "code").mkdir(parents=True)
    (root / "code" / ".ddplab-code.json").write_text('{"hash": "abc"}\n')
    (root / "python").write_text(sys.executable + "\n")
    sock = str(root / "tmux.sock")
    yield {"root": root, "socket": sock}
    subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True, check=False)


def start_spec(lab, run, script, env="SECRET=1\n"):
    return {"socket": lab["socket"], "session": run, "run_dir": str(lab["root"] / "runs" / run),
            "cwd": str(lab["root"] / "code"), "code_json": str(lab["root"] / "code" / ".ddplab-code.json"),
            "last_run_file": str(lab["root"] / "last_run"),
            "files": [{"name": "trainer.env", "mode": "0600", "content": env},
                      {"name": "launch.sh", "mode": "0755", "content": script}]}


def wait_for(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_facts_of_an_unstarted_run(lab):
    ckpt = lab["root"] / "runs" / "r1" / "out" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "step_000010.pt").write_bytes(b"x")
    (ckpt / "notes.txt").write_text("not a checkpoint")
    rc, facts, _ = probe("launch-facts", {"python": "", "python_file": str(lab["root"] / "python"),
                                          "socket": lab["socket"], "session": "r1", "ckpt_dir": str(ckpt),
                                          "script": str(lab["root"] / "code" / "train.py")})
    assert rc == 0
    assert facts["python"] == sys.executable
    assert facts["nproc"] == len(os.sched_getaffinity(0)) == len(facts["cpus"])
    assert facts["cpus"] == sorted(os.sched_getaffinity(0))
    assert facts["machine"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip() != ""
    assert facts["session"] == "none" and facts["script_exists"] is False
    assert facts["ckpts"] == ["step_000010.pt"]


def test_a_never_prepared_node_has_no_python(lab):
    rc, facts, _ = probe("launch-facts", {"python_file": str(lab["root"] / "missing"),
                                          "socket": lab["socket"], "session": "r1"})
    assert rc == 0 and facts["python"] == "" and facts["script_exists"] is None and facts["ckpts"] == []


def test_start_places_the_files_and_runs_the_script_in_tmux(lab):
    run_dir = lab["root"] / "runs" / "r2"
    run_dir.mkdir(parents=True)
    (run_dir / "exit_code").write_text("1\n")  # an earlier attempt's marker: removed before the start
    script = 'cd "$(dirname "$0")"; . ./trainer.env; echo "$SECRET $PWD" > seen; echo 0 > exit_code\n'
    rc, out, err = probe("start-rank", start_spec(lab, "r2", script))
    assert rc == 0, (out, err)
    assert out["started"] and not out["replaced_dead_session"]
    assert stat.S_IMODE((run_dir / "trainer.env").stat().st_mode) == 0o600
    assert stat.S_IMODE((run_dir / "launch.sh").stat().st_mode) == 0o755
    assert json.loads((run_dir / "code.json").read_text()) == {"hash": "abc"}
    assert (lab["root"] / "last_run").read_text() == "r2\n"
    wait_for(run_dir / "exit_code")
    assert (run_dir / "exit_code").read_text() == "0\n"
    assert (run_dir / "seen").read_text().split() == ["1", str(run_dir)]
    # remain-on-exit: the finished session stays (its pane is read by status and collect) as dead
    rc, facts, _ = probe("launch-facts", {"socket": lab["socket"], "session": "r2"})
    assert facts["session"] == "dead"
    # starting the same run again replaces the dead session
    (run_dir / "exit_code").unlink()
    rc, out, err = probe("start-rank", start_spec(lab, "r2", script))
    assert rc == 0 and out["replaced_dead_session"], (out, err)
    wait_for(run_dir / "exit_code")


def test_a_live_session_is_refused_and_left_running(lab):
    rc, out, err = probe("start-rank", start_spec(lab, "r3", "sleep 30\n"))
    assert rc == 0, (out, err)
    rc, facts, _ = probe("launch-facts", {"socket": lab["socket"], "session": "r3"})
    assert facts["session"] == "live"
    rc, out, _ = probe("start-rank", start_spec(lab, "r3", "echo replaced > replaced\n"))
    assert rc == 1 and not out["ok"] and "still running" in out["error"]
    time.sleep(0.5)
    assert not (lab["root"] / "runs" / "r3" / "replaced").exists()
    rc, facts, _ = probe("launch-facts", {"socket": lab["socket"], "session": "r3"})
    assert facts["session"] == "live"


def test_a_spec_without_its_fields_is_one_usage_error(lab):
    out = subprocess.run([sys.executable, "-m", "nodeprobe", "start-rank"], input='{"socket": "s"}', cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "has no session, run_dir, cwd" in out.stderr
    assert "Traceback" not in out.stderr


def test_run_status_wait_returns_when_the_exit_code_appears(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = subprocess.Popen(["bash", "-c", f"sleep 1; echo 0 > {run_dir}/exit_code"])
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "nodeprobe", "run-status", "--run-dir", str(run_dir),
                          "--socket", str(tmp_path / "none.sock"), "--session", "=x", "--wait", "30"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    waited = time.monotonic() - t0
    writer.wait()
    state = json.loads(out.stdout)
    assert state["state"] == "exited" and state["code"] == 0
    assert 0.9 < waited < 25  # waited for the marker, and not the whole 30 s


def test_place_files_writes_only_what_differs(tmp_path):
    record = tmp_path / "record.json"
    spec = {"files": [{"path": str(record), "content": '{"a": 1}', "mode": "0644"}]}
    rc, out, _ = probe("place-files", spec)
    assert rc == 0 and out["changed"] == [str(record)] and record.read_text() == '{"a": 1}\n'
    rc, out, _ = probe("place-files", spec)
    assert rc == 0 and out["changed"] == []  # a prepared node: nothing written
    record.chmod(0o600)
    rc, out, _ = probe("place-files", spec)
    assert out["changed"] == [str(record)] and stat.S_IMODE(record.stat().st_mode) == 0o644
    missing = str(tmp_path / "no" / "dir" / "x")
    rc, out, _ = probe("place-files", {"files": [{"path": missing, "content": ""}]})
    assert rc == 1 and not out["ok"] and "FileNotFoundError" in out["error"]
