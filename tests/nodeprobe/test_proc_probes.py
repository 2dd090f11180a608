"""port-holder and lab-processes against real processes started here."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

from tests.helpers.probes import probe


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
        while time.monotonic() < deadline and not os.path.exists(f"/proc/{orphan}/cmdline"):
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


def _procs_alone(tmp_path, *args: str) -> dict:
    """nodeprobe/procs.py shipped alone, as roles/stale_processes runs it (stop.yml may find no code)."""
    import json
    import shutil
    from pathlib import Path

    alone = tmp_path / "shipped" / "procs.py"
    alone.parent.mkdir(exist_ok=True)
    shutil.copy(Path(__file__).resolve().parents[2] / "nodeprobe" / "procs.py", alone)
    out = subprocess.run([sys.executable, str(alone), *args], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_stale_finds_and_kills_only_this_runs_ranks(tmp_path):
    root = tmp_path / "lab"
    root.mkdir()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    env = {**os.environ, "DDPLAB_ROOT": str(root)}
    mine = subprocess.Popen(sleeper, env={**env, "DDPLAB_RUN_ID": "run-a"})
    other_run = subprocess.Popen(sleeper, env={**env, "DDPLAB_RUN_ID": "run-b"})
    other_lab = subprocess.Popen(sleeper, env={**os.environ, "DDPLAB_ROOT": str(tmp_path / "elsewhere")})
    try:
        time.sleep(0.3)  # let the children exec (their environ is read from /proc)
        found = _procs_alone(tmp_path, "--root", str(root))["found"]
        assert {p["pid"] for p in found} == {mine.pid, other_run.pid}
        assert all(p["why"].startswith("ddplab rank of this lab") for p in found)
        r = _procs_alone(tmp_path, "--root", str(root), "--run-id", "run-a", "--kill", "--grace", "5")
        assert [p["pid"] for p in r["killed"]] == [mine.pid] and r["survivors"] == []
        assert mine.wait(timeout=10) is not None and other_run.poll() is None and other_lab.poll() is None
    finally:
        for p in (mine, other_run, other_lab):
            p.kill()
            p.wait(timeout=5)


def test_stale_with_a_port_names_its_listener(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        found = _procs_alone(tmp_path, "--root", str(tmp_path / "lab"), "--port", str(port))["found"]
    assert [p["pid"] for p in found] == [os.getpid()]
    assert found[0]["why"] == f"listening on master port {port}"
