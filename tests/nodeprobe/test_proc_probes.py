"""port-holder and lab-processes against real processes started here."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nodeprobe import procs
from tests.helpers.probes import probe

PROCS = Path(__file__).resolve().parents[2] / "nodeprobe" / "procs.py"
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
# What the stale_processes role's launcher test looks for: a torchrun command line (the extra argv is
# only text for /proc/<pid>/cmdline; python -c ignores it).
TORCHRUN = [*SLEEP, "-m", "torch.distributed.run", "--nnodes", "2"]
# Another user cannot run this venv's interpreter (it lives under /root): theirs is the system one.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"


def _wait_for(pattern: str, stream, timeout: float = 15) -> re.Match:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        line = stream.readline()
        text += line
        m = re.search(pattern, text)
        if m:
            return m
    raise AssertionError(f"{pattern!r} not seen in {text!r}")


def test_port_holder_names_a_real_http_server():
    srv = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = int(_wait_for(r"port (\d+)", srv.stdout).group(1))
        r = probe("port-holder", "--port", str(port))
        assert r["free"] is False
        assert [h["pid"] for h in r["holders"]] == [srv.pid]
        h = r["holders"][0]
        assert "-m http.server" in h["cmdline"] and h["address"] == "127.0.0.1" and h["ppid"] == os.getpid()
        assert r["nodeprobe_listener"] is False
    finally:
        srv.kill()
        srv.wait(timeout=5)
    assert probe("port-holder", "--port", str(port))["free"] is True


def test_port_holder_sees_ipv6_listeners():
    s = socket.socket(socket.AF_INET6)
    s.bind(("::1", 0))
    s.listen(1)
    try:
        r = probe("port-holder", "--port", str(s.getsockname()[1]))
        assert r["holders"][0]["pid"] == os.getpid()  # this pytest process holds it
        assert (r["holders"][0]["family"], r["holders"][0]["address"]) == ("ipv6", "::1")
    finally:
        s.close()


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_lab_processes_finds_orphans_of_this_lab_only(tmp_path):
    lab = tmp_path / "ddplab"
    lab.mkdir()
    (lab / "rank.py").write_text("import time\ntime.sleep(60)\n")
    # An orphan as the field notes had: started in the background by a shell that then exits.
    out = subprocess.run(["sh", "-c", f"{sys.executable} {lab}/rank.py >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, timeout=10)
    orphan = int(out.stdout.strip())
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and b"rank.py" not in cmdline(orphan):  # the shell's fork exec'd
            time.sleep(0.05)
        r = probe("lab-processes", "--root", str(lab))
        found = {p["pid"]: p for p in r["processes"]}
        assert orphan in found and unrelated.pid not in found
        with open(f"/proc/{orphan}/stat") as f:
            real_ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        assert found[orphan]["ppid"] == real_ppid
        assert found[orphan]["orphan"] == (real_ppid == 1) and found[orphan]["role"] == "rank"
        assert all("nodeprobe" not in p["cmdline"] for p in r["processes"])  # not itself
        assert r["root"] == str(lab.resolve())
    finally:
        os.kill(orphan, 9)
        unrelated.kill()
        unrelated.wait(timeout=5)
    time.sleep(0.2)
    assert orphan not in {p["pid"] for p in probe("lab-processes", "--root", str(lab))["processes"]}


def _procs_alone(tmp_path, *args: str, user: str | None = None) -> dict:
    """nodeprobe/procs.py shipped alone, as roles/stale_processes runs it (stop.yml may find no code);
    ``user``: run it as that user (the test runs as root; tmp_path's parents are closed to others)."""
    pre = None
    if user:
        pw = pwd.getpwnam(user)

        def pre():
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
    with tempfile.TemporaryDirectory(prefix="shipped-") as shipped:
        os.chmod(shipped, 0o755)
        alone = shutil.copy(PROCS, shipped)
        os.chmod(alone, 0o644)
        out = subprocess.run([SYSTEM_PYTHON if user else sys.executable, alone, *args], capture_output=True,
                             text=True, timeout=60, cwd=shipped, preexec_fn=pre)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _spawn(argv, root=None, run=None, user=None, **kw) -> subprocess.Popen:
    if user:
        argv = [SYSTEM_PYTHON, *argv[1:]]
    env = dict(os.environ)
    if root:
        env["DDPLAB_ROOT"] = str(root)
    if run:
        env["DDPLAB_RUN_ID"] = run
    pre = None
    if user:
        uid = pwd.getpwnam(user).pw_uid

        def pre():
            os.setuid(uid)
    return subprocess.Popen(argv, env=env, preexec_fn=pre, cwd="/", **kw)


def _exec_done(*procs: subprocess.Popen) -> None:
    """Wait until each child runs its own program (its environ and cmdline are read from /proc)."""
    deadline = time.monotonic() + 10
    for p in procs:
        while "time.sleep" not in (Path(f"/proc/{p.pid}/cmdline").read_bytes().decode(errors="replace")):
            assert time.monotonic() < deadline, f"child {p.pid} did not start"
            time.sleep(0.05)


@pytest.fixture
def children():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait(timeout=5)


def _requires_root():
    if os.getuid() != 0:
        pytest.skip("starts processes of another user: needs root")


def test_stale_finds_and_kills_only_this_runs_ranks(tmp_path, children):
    root = tmp_path / "lab"
    root.mkdir()
    mine = _spawn(SLEEP, root, "run-a")
    other_run = _spawn(SLEEP, root, "run-b")
    other_lab = _spawn(SLEEP, tmp_path / "elsewhere")
    children += [mine, other_run, other_lab]
    _exec_done(*children)
    found = _procs_alone(tmp_path, "--root", str(root))["found"]
    assert {p["pid"] for p in found} == {mine.pid, other_run.pid}
    assert all(p["why"].startswith("ddplab rank of this lab") for p in found)
    r = _procs_alone(tmp_path, "--root", str(root), "--run-id", "run-a", "--kill", "--grace", "5")
    assert [p["pid"] for p in r["killed"]] == [mine.pid] and r["survivors"] == []
    assert mine.wait(timeout=10) is not None and other_run.poll() is None and other_lab.poll() is None


def test_a_live_run_is_refused_and_its_leftover_neighbour_is_not_touched(tmp_path, children):
    root = tmp_path / "lab"
    live_torchrun = _spawn(TORCHRUN, root, "run-live")
    live_rank = _spawn(SLEEP, root, "run-live")
    leftover = _spawn(SLEEP, root, "run-dead")  # a rank whose torchrun is gone
    children += [live_torchrun, live_rank, leftover]
    _exec_done(*children)
    r = _procs_alone(tmp_path, "--root", str(root), "--node", "node1", "--kill", "--grace", "2")
    assert r["live_runs"] == ["run-live"]
    assert {p["pid"] for p in r["refused"]} == {live_torchrun.pid, live_rank.pid}
    assert [p["pid"] for p in r["found"]] == [leftover.pid]
    [error] = r["errors"]
    assert error.startswith(f"ddplab: error: node1: run run-live is still running there (torchrun PID "
                            f"{live_torchrun.pid}")
    assert "playbooks/stop.yml -e ddplab_run_id=run-live" in error
    assert "-e ddplab_replace_running=true" in error
    # an error signals nothing: the role fails before any node is changed
    assert r["killed"] == [] and all(p.poll() is None for p in children)


def test_replace_ends_the_live_run_and_stop_ends_its_own_run_live_or_not(tmp_path, children):
    root = tmp_path / "lab"
    a_torchrun, a_rank = _spawn(TORCHRUN, root, "run-a"), _spawn(SLEEP, root, "run-a")
    b_torchrun = _spawn(TORCHRUN, root, "run-b")
    children += [a_torchrun, a_rank, b_torchrun]
    _exec_done(*children)
    stop = _procs_alone(tmp_path, "--root", str(root), "--run-id", "run-b", "--kill", "--grace", "2")
    assert stop["errors"] == [] and [p["pid"] for p in stop["killed"]] == [b_torchrun.pid]
    assert b_torchrun.wait(timeout=10) is not None and a_torchrun.poll() is None
    r = _procs_alone(tmp_path, "--root", str(root), "--kill", "--replace", "--grace", "2")
    assert r["errors"] == [] and r["survivors"] == []
    assert {p["pid"] for p in r["killed"]} == {a_torchrun.pid, a_rank.pid}
    assert all("replaced: ddplab_replace_running=true" in p["why"] for p in r["killed"])
    assert a_torchrun.wait(timeout=10) is not None and a_rank.wait(timeout=10) is not None


def test_another_users_lab_processes_are_never_signalled(tmp_path, children):
    _requires_root()
    root = tmp_path / "lab"
    theirs = _spawn(TORCHRUN, root, "run-x", user="nobody")  # even a live run of theirs: not ours to refuse
    their_leftover = _spawn(SLEEP, root, "run-y", user="nobody")
    children += [theirs, their_leftover]
    _exec_done(*children)
    r = _procs_alone(tmp_path, "--root", str(root), "--kill", "--replace", "--grace", "2")
    assert r["found"] == [] and r["killed"] == [] and r["errors"] == [] and r["live_runs"] == []
    assert {(p["pid"], p["user"]) for p in r["others"]} == {(theirs.pid, "nobody"),
                                                            (their_leftover.pid, "nobody")}
    assert theirs.poll() is None and their_leftover.poll() is None


def _listener(port_file: Path) -> list[str]:
    code = ("import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
            f"open({str(port_file)!r},'w').write(str(s.getsockname()[1])); time.sleep(60)")
    return [sys.executable, "-c", code]


def _port_of(port_file: Path) -> str:
    # a bound, not a wait: the hand-started torchrun imports torch before its rank listens (6.7-8.0 s here
    # at load 12.5; CI's 2 cores reach load 15-20)
    deadline = time.monotonic() + 120
    while not (port_file.exists() and port_file.read_text()):
        assert time.monotonic() < deadline, "the listener did not start"
        time.sleep(0.05)
    return port_file.read_text()


def test_another_program_on_the_master_port_is_named_not_killed(tmp_path, children):
    squatter = _spawn(_listener(tmp_path / "port"))
    children.append(squatter)
    port = _port_of(tmp_path / "port")
    r = _procs_alone(tmp_path, "--root", str(tmp_path / "lab"), "--port", port, "--node", "node0", "--kill")
    me = pwd.getpwuid(os.getuid()).pw_name
    assert [(h["pid"], h["user"]) for h in r["holders"]] == [(squatter.pid, me)]
    [error] = r["errors"]
    assert error.startswith(f"ddplab: error: node0: master port {port} is held by PID {squatter.pid} of user "
                            f"{me}: {sys.executable} -c import socket")
    assert "never another program" in error and "-e ddplab_master_port=N" in error
    assert r["killed"] == [] and squatter.poll() is None


def test_a_leftover_of_the_lab_on_the_master_port_is_ended(tmp_path, children):
    leftover = _spawn(_listener(tmp_path / "port"), tmp_path / "lab", "run-old")
    children.append(leftover)
    port = _port_of(tmp_path / "port")
    r = _procs_alone(tmp_path, "--root", str(tmp_path / "lab"), "--port", port, "--kill", "--grace", "2")
    assert r["errors"] == [] and r["holders"] == []
    assert [p["pid"] for p in r["killed"]] == [leftover.pid]
    assert leftover.wait(timeout=10) is not None


def test_another_users_port_holder_is_named_by_a_root_scan_for_the_login_user(tmp_path, children):
    _requires_root()
    squatter = _spawn(_listener(tmp_path / "port"))  # root's; the probe runs as nobody
    children.append(squatter)
    port = _port_of(tmp_path / "port")
    args = ("--root", str(tmp_path / "lab"), "--port", port, "--node", "node0")
    as_user = _procs_alone(tmp_path, *args, "--kill", user="nobody")
    # nobody sees the socket and its owner, not the PID (root's /proc/<pid>/fd is not readable)
    assert [(h["pid"], h["user"]) for h in as_user["holders"]] == [(None, "root")]
    assert "a process of user root that this user cannot see" in as_user["errors"][0]
    assert "never another user's process" in as_user["errors"][0]
    nobody = pwd.getpwnam("nobody").pw_uid
    assert as_user["uid"] == nobody
    named = _procs_alone(tmp_path, *args, "--uid", str(nobody))  # the role's become scan
    assert [(h["pid"], h["user"]) for h in named["holders"]] == [(squatter.pid, "root")]
    assert f"held by PID {squatter.pid} of user root: {sys.executable} -c" in named["errors"][0]
    # a scan for another uid never signals, even when asked to
    refused = _procs_alone(tmp_path, *args, "--uid", str(nobody), "--kill")
    assert refused["killed"] == [] and any("--kill for uid" in e for e in refused["errors"])
    assert squatter.poll() is None


def test_a_torchrun_started_by_hand_in_the_lab_folder_is_left_alone_and_named(tmp_path, children):
    """A torchrun the user started by hand in the lab folder (no DDPLAB_ROOT, no run id) is their live run:
    prepare (also with replace) leaves it running and names it; a leftover rank ddplab started is still
    ended; when it holds the master port it is named as the holder, not ended. The old code took it for a
    leftover (no run id: not live) and killed it."""
    lab = tmp_path / "lab"
    (lab / "code").mkdir(parents=True)
    script = lab / "code" / "train.py"
    script.write_text("import socket, sys, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                      "open(sys.argv[1], 'w').write(str(s.getsockname()[1])); time.sleep(120)\n")
    port_file = tmp_path / "port"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPLAB_")}
    # the real torchrun, as a user types it in the lab folder
    by_hand = subprocess.Popen([str(Path(sys.executable).parent / "torchrun"), "--standalone",
                                "--nproc-per-node=1", str(script), str(port_file)], cwd=str(lab), env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    leftover = _spawn(SLEEP, lab, "run-dead")
    children += [by_hand, leftover]
    port = _port_of(port_file)
    r = _procs_alone(tmp_path, "--root", str(lab), "--kill", "--replace", "--grace", "2")
    assert r["errors"] == [] and [p["pid"] for p in r["killed"]] == [leftover.pid], r
    assert by_hand.pid in {p["pid"] for p in r["by_hand"]}, r["by_hand"]
    assert all("started by hand" in p["why"] for p in r["by_hand"])
    assert by_hand.poll() is None, "the hand-started torchrun was killed"
    # its rank listens on the master port: named (by PID and command line) as another program's, not ended
    held = _procs_alone(tmp_path, "--root", str(lab), "--port", port, "--node", "node0", "--kill")
    assert held["killed"] == [] and "never another program" in held["errors"][0], held
    assert f"{script}" in held["errors"][0]
    assert by_hand.poll() is None
    os.killpg(by_hand.pid, 9)


def test_only_torchrun_and_trainer_commands_count_as_hand_started_ranks():
    lab = "/home/u/ddplab"
    assert procs.hand_started_rank(f"/usr/bin/python3 /home/u/.venv/bin/torchrun -m trainer --data {lab}")
    assert procs.hand_started_rank(f"python3 -m torch.distributed.run -m trainer --out {lab}/runs/x")
    assert procs.hand_started_rank(f"/home/u/ddplab/venv/bin/python -m trainer --data {lab}/data")
    assert procs.hand_started_rank(f"python {lab}/code/trainer/__main__.py")
    assert procs.hand_started_rank(f"torchrun --standalone {lab}/code/train.py")
    for editor in (f"vim {lab}/code/trainer/model.py", f"nano {lab}/code/trainer/train.py",
                   f"git -C {lab}/code log", f"less {lab}/runs/r/launch.log",
                   f"python3 -m http.server --directory {lab}/code/trainer/",
                   f"code {lab}/code/trainer/config.py"):
        assert not procs.hand_started_rank(editor), editor


def test_an_editor_open_in_the_lab_folder_is_never_the_labs(tmp_path, children):
    lab = tmp_path / "lab"
    (lab / "code" / "trainer").mkdir(parents=True)
    model = lab / "code" / "trainer" / "model.py"
    model.write_text("x = 1\n")
    # a process named like an editor (argv0 "vim"), the lab file on its command line, cwd in the lab
    editor = subprocess.Popen(["bash", "-c", f"exec -a vim tail -f {model}"], cwd=str(lab / "code"),
                              stdout=subprocess.DEVNULL)
    children.append(editor)
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{editor.pid}/cmdline").read_bytes().startswith(b"vim"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = _procs_alone(tmp_path, "--root", str(lab), "--kill", "--grace", "1")
    assert r["found"] == [] and r["killed"] == [], r
    assert editor.poll() is None
    assert procs.lab_processes(str(lab), shared=True)["processes"] == []  # preflight's report: not ours
