"""Bring your own training code (issue 7) on 2 simulated hosts: the field notes' dist_train.py launched
unchanged through launch.yml, code parity in preflight, the torch pin against a user's requirements,
a user's FSDP2 script trained sharded (issue 49), and several ranks per node.

The seed's launch runs the smoke run of the code on the master first (2 CPU ranks over loopback gloo).
One cluster serves the module: the `seed_run` fixture syncs the seed and trains it once, and the tests
that need prepared hosts or the synced seed ask for it, so each test also runs alone. The
ranks-per-node test discards the cluster at its end, so it comes last (a test after it would prepare fresh
hosts again).
"""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.playbooks import playbook, recap, tail
from tests.helpers.wheels import pure_wheel

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
WHEELS = "/root/ddplab/wheelhouse"  # the node's copy of the wheels it installs
COMMON = {"ddplab_threads": 1, "ddplab_wait_poll": 10, "ddplab_rdzv_timeout": 30}
HOSTS = ("node0", "node1")
# the smoke run's limit in the compiled test: its ranks compiled cold for 40 to 115 s on this 2-core machine
# under load, the rest (startup, steps) took 5 to 30 s; its limit does not count the compile
COMPILE_LIMIT_S = 60


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    runs = tmp_path_factory.mktemp("byo-runs")
    # your own code brings its own data: no shards are copied or checked
    return {"ddplab_data_dir": "", "ddplab_runs_dir": runs, **COMMON}


@pytest.fixture(scope="module")
def seed_repo(tmp_path_factory):
    """The unchanged seed in a git repo, plus an ignored file that must not travel."""
    repo = tmp_path_factory.mktemp("seed-repo")
    shutil.copy(FIXTURES / "seed_code" / "dist_train.py", repo / "dist_train.py")
    (repo / ".gitignore").write_text("*.secret\n")
    git(repo, "init", "-q")
    git(repo, "add", "dist_train.py", ".gitignore")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "seed")
    (repo / "notes.secret").write_text("stays on the control host\n")
    return repo


def node_python(cluster, host):
    return cluster.exec(host, ["cat", "/root/ddplab/python"], timeout=30, check=True).stdout.strip()


def torch_version(cluster, host, python):
    code = "import torch; print(torch.__version__.split('+')[0])"
    # -I: not from the login folder (test_two_ranks_per_node_make_world_size_four plants a torch.py there)
    return cluster.exec(host, [python, "-I", "-c", code], timeout=120, check=True).stdout.strip()


@pytest.fixture(scope="module")
def seed_run(simlan_cluster, lab, seed_repo):
    """launch.yml of the unchanged seed on fresh hosts, waited for: the playbook run."""
    simlan2 = simlan_cluster(2, fresh=True)
    extra = {**lab, "ddplab_wait": "true", "ddplab_run_id": "byo-seed", "ddplab_code_dir": seed_repo,
             "ddplab_entrypoint": "dist_train.py"}
    # torchrun's own per-rank log files (PET_* = torchrun flags from the environment) stand in for
    # files a user's code writes; ddplab_collect_globs brings them back.
    more = {"ddplab_env": {"PET_LOG_DIR": "torchrun-logs", "PET_TEE": "3"},
            "ddplab_collect_globs": ["torchrun-logs/**/stdout.log"]}
    return playbook("launch.yml", "-e", json.dumps(more), inventory=simlan2.inventory_dir, timeout=600,
                    extra=extra)


def _seeded(seed_run) -> None:
    assert seed_run.returncode == 0, "the module's seed launch.yml failed:\n" + tail(seed_run)


def test_seed_trains_across_two_hosts_unchanged(simlan2, lab, seed_run, seed_repo):
    _seeded(seed_run)
    seed = (FIXTURES / "seed_code" / "dist_train.py").read_bytes()
    run = lab["ddplab_runs_dir"] / "byo-seed"
    for host, rank in zip(HOSTS, (0, 1), strict=True):
        log = (run / host / "launch.log").read_text()
        assert f"rank {rank} exited with code 0" in log
        assert "dist_train.py" in (run / host / "launch.sh").read_text()
        assert (run / host / "pane.txt").read_text().count("exited with code 0") == 1
        collected = list((run / host / "torchrun-logs").rglob("stdout.log"))
        assert collected, f"no torchrun-logs collected from {host}"
        # the node got the tracked files only, byte for byte; the ranks ran there (ddplab_workdir: code), so
        # torchrun's relative PET_LOG_DIR landed beside them
        user = simlan2.exec(host, ["ls", "-A", "/root/ddplab/code/user"], timeout=30, check=True)
        assert sorted(user.stdout.split()) == [".gitignore", "dist_train.py", "torchrun-logs"]
        copy = simlan2.exec(host, ["cat", "/root/ddplab/code/user/dist_train.py"], timeout=30, check=True)
        assert copy.stdout.encode() == seed
        shards = simlan2.exec(host, ["find", "/root/ddplab", "-name", "*.parquet"], timeout=30, check=True)
        assert shards.stdout.strip() == ""  # ddplab_data_dir "": nothing copied
    # the smoke run on the master before the ranks started: it trained as one DDP run, left nothing in the
    # code folder (listed above) nor in the run folder, and remembered its pass in the lab folder
    smoke = (r"the smoke run of dist_train\.py on node0 \(2 CPU ranks over loopback gloo, [\d.]+ s\): "
             r"it trains as one DDP run: 2 optimizer steps on each rank")
    assert re.search(smoke, seed_run.stdout), tail(seed_run)
    passed = simlan2.exec("node0", ["cat", "/root/ddplab/smoke-passed.json"], timeout=30, check=True)
    assert len(json.loads(passed.stdout)["passed"]) == 1
    scratch = simlan2.exec("node0", ["test", "-e", "/root/ddplab/runs/byo-seed/smoke"], timeout=30)
    assert scratch.returncode != 0
    pane0 = (run / "node0" / "pane.txt").read_text()
    assert "epoch 2 loss" in pane0 and "epoch 2 loss" in (run / "node0" / "launch.log").read_text()
    assert any("epoch 2 loss" in p.read_text() for p in (run / "node0" / "torchrun-logs").rglob("stdout.log"))

    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_codes"] == {"node0/node0": 0, "node1/node1": 0}
    assert summary["has_metrics"] is False and not (run / "loss.png").exists()
    assert summary["code_identical"] is True
    trees = {t["dest"]: t for t in summary["code"]["node0"]["trees"]}
    assert trees["user"]["git_commit"] == git(seed_repo, "rev-parse", "HEAD")
    assert trees["user"]["git_dirty"] is False and trees["user"]["method"] == "git ls-files"
    assert "identical on every node" in (run / "report.md").read_text()
    verdict = json.loads((lab["ddplab_runs_dir"] / "preflight" / "latest.json").read_text())
    assert {verdict["hosts"][h]["data"]["status"] for h in HOSTS} == {"n/a"}


def test_code_changed_on_one_node_after_sync_fails_preflight(simlan2, lab, seed_run, seed_repo):
    """The changed copy is the master's: preflight compares with what the control host would sync, so it
    names node0 (comparing the nodes with each other would blame node1)."""
    _seeded(seed_run)
    extra = {**lab, "ddplab_code_dir": seed_repo, "ddplab_entrypoint": "dist_train.py"}
    simlan2.exec("node0", ["bash", "-c", "echo '# local tweak' >> /root/ddplab/code/user/dist_train.py"],
                 timeout=30, check=True)
    proc = playbook("preflight.yml", inventory=simlan2.inventory_dir, timeout=300, extra=extra)
    assert proc.returncode != 0, tail(proc)
    verdict = (lab["ddplab_runs_dir"] / "preflight" / "latest.json").read_text()
    assert "user/ differs from the control host" in verdict and "sync user/ to node0" in verdict, tail(proc)
    assert "sync user/ to node1" not in verdict

    fixed = playbook("prepare.yml", "--tags", "code", inventory=simlan2.inventory_dir, timeout=300,
                     extra=extra)
    assert fixed.returncode == 0, tail(fixed)
    again = playbook("preflight.yml", inventory=simlan2.inventory_dir, timeout=300, extra=extra)
    assert again.returncode == 0, tail(again)


def test_requirements_asking_for_another_torch_are_refused(simlan2, lab, seed_run, tmp_path):
    _seeded(seed_run)  # prepared hosts: their pinned Python must stay as it is
    code = tmp_path / "code"
    shutil.copytree(FIXTURES / "rank_probe", code)
    (code / "requirements.txt").write_text("numpy\ntorch==2.1.0\n")
    before = {h: (node_python(simlan2, h), torch_version(simlan2, h, node_python(simlan2, h))) for h in HOSTS}
    proc = playbook("prepare.yml", inventory=simlan2.inventory_dir, timeout=300,
                    extra={**lab, "ddplab_code_dir": code, "ddplab_entrypoint": "probe/__main__.py",
                           "ddplab_pip_requirements": "requirements.txt"})
    assert proc.returncode != 0
    assert f"ddplab: error: {code}/requirements.txt line 2 asks for torch==2.1.0" in proc.stdout, tail(proc)
    assert "Traceback" not in proc.stdout + proc.stderr
    for host in HOSTS:
        python, version = before[host]
        assert node_python(simlan2, host) == python
        assert torch_version(simlan2, host, python) == version == "2.13.0"
        assert simlan2.exec(host, ["test", "-e", "/root/ddplab/venv-code"], timeout=30).returncode != 0


def test_a_users_fsdp2_script_trains_sharded_across_two_hosts(simlan2, lab, seed_run, tmp_path):
    """A user's FSDP2 script (fixtures/fsdp_code, fully_shard per block and the root) launched on the
    prepared hosts: each rank holds half of the model; the lines it prints give the report and the
    progress (status's reader).
    Its smoke run (the shards checked, its all-gathers and reduce-scatters counted) is
    tests/nodeprobe/test_code_smoke.py's, on the same script."""
    _seeded(seed_run)
    code = tmp_path / "fsdp"
    shutil.copytree(FIXTURES / "fsdp_code", code)
    extra = {**lab, "ddplab_wait": "true", "ddplab_run_id": "byo-fsdp", "ddplab_code_dir": code,
             "ddplab_entrypoint": "fsdp_train.py", "ddplab_smoke_run": "false"}
    more = {"ddplab_entrypoint_args": ["--steps", "12"]}
    proc = playbook("launch.yml", "-e", json.dumps(more), inventory=simlan2.inventory_dir, timeout=600,
                    extra=extra)
    assert proc.returncode == 0, tail(proc)
    run = lab["ddplab_runs_dir"] / "byo-fsdp"
    held = [re.search(rf"rank {r}: holds ([\d,]+) of ([\d,]+) parameter values",
                      (run / h / "launch.log").read_text()) for h, r in zip(HOSTS, (0, 1), strict=True)]
    assert all(held), tail(proc)
    local, total = [[int(m.group(i).replace(",", "")) for m in held] for i in (1, 2)]
    assert sum(local) == total[0] == total[1] and 0 < local[0] < total[0]  # each rank half of the model
    iters = re.findall(r"^iter (\d+): loss (\S+),", (run / "node0" / "launch.log").read_text(), re.M)
    assert [int(i) for i, _ in iters] == list(range(12)) and float(iters[-1][1]) < float(iters[0][1])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["all_exited_zero"] is True and summary["metrics_from"] == "launch.log (nanogpt lines)"
    assert summary["last_step"] == 11 and summary["loss_last"] == float(iters[-1][1])
    assert summary["tokens_per_sec"] > 0  # 2 ranks x 8 x 32 tokens an iteration, over its median time
    report = (run / "report.md").read_text()
    assert f"- loss_last: {summary['loss_last']:.4g}" in report and "- tokens_per_sec: " in report, report
    # the wait's progress, status's reader of the same lines
    assert re.search(r"step 11\b.* loss ", proc.stdout), tail(proc)


def test_the_masters_compile_cache_makes_each_nodes_first_compile_warm(simlan2, lab, seed_run, tmp_path):
    """Compile once per lab: code whose input preparation goes through torch.compile. The smoke run compiles
    it cold on the master, each smoke rank into a folder of its own under the lab's compile cache, none into
    torch's default /tmp/torchinductor_<user> (which another local user can create first: here made
    world-writable beforehand, as such a user would leave it), and says how long it compiled (not counted
    against its limit).
    The master's cache (seed.tar) reaches the control host once and node1 from there (star: 2 nodes), 0600
    in 0700 folders; each rank of the run then finds its graph in its own folder's cache (inductor's FX
    graph cache: a hit, no miss), node1's too, which never compiled it."""
    _seeded(seed_run)
    code = tmp_path / "code"
    shutil.copytree(FIXTURES / "compiled_prep", code)
    planted = "/tmp/torchinductor_root"
    simlan2.exec("node0", ["sh", "-c", f"mkdir -p {planted} && chmod 777 {planted}"], timeout=30, check=True)
    extra = {**lab, "ddplab_wait": "true", "ddplab_run_id": "byo-compiled", "ddplab_code_dir": code,
             "ddplab_entrypoint": "train.py", "ddplab_smoke_seconds": COMPILE_LIMIT_S}
    proc = playbook("launch.yml", inventory=simlan2.inventory_dir, timeout=900, extra=extra)
    assert proc.returncode == 0, tail(proc)
    compiled = re.search(r"\(2 CPU ranks over loopback gloo, ([\d.]+) s\): it trains as one DDP run: .*; "
                         r"([\d.]+) s of torch\.compile, not counted against ddplab_smoke_seconds",
                         proc.stdout)
    assert compiled and float(compiled.group(2)) > 0, tail(proc)
    print(f"\nsmoke run: {compiled.group(1)} s, {compiled.group(2)} s of it compiling cold")
    assert simlan2.exec("node0", ["ls", "-A", planted], timeout=30, check=True).stdout == ""
    for rank in (0, 1):
        folder = f"/root/ddplab/compile-cache/smoke-rank{rank}"
        built = simlan2.exec("node0", ["find", folder, "-name", "*.so"], timeout=30, check=True).stdout
        assert built.strip(), f"smoke rank {rank} built nothing in its own folder"
    assert re.search(r"the master's torch\.compile cache \(\d+ files, [\d.]+ MiB, warmed by the smoke run\) "
                     r"goes to node0, node1", proc.stdout), tail(proc)
    run = lab["ddplab_runs_dir"] / "byo-compiled"
    for host, rank in zip(HOSTS, (0, 1), strict=True):
        log = (run / host / "launch.log").read_text()
        assert re.search(rf"rank {rank} local 0 first step [\d.]+ s fxgraph hit 1 miss 0", log), log[-2000:]
        first = re.search(r"first step [\d.]+ s", log).group(0)
        print(f"\n{host}: {first} (shipped cache)")
        cache = "/root/ddplab/compile-cache"
        modes = simlan2.exec(host, ["stat", "-c", "%a %n", cache, f"{cache}/seed.tar", f"{cache}/local0"],
                             timeout=30, check=True).stdout.split("\n")
        assert [m.split()[0] for m in modes if m] == ["700", "600", "700"], modes
    assert oct((run / "compile-cache" / "seed.tar").stat().st_mode & 0o777) == "0o600"


def fill_requirements(code: Path, wheelhouse: Path) -> subprocess.CompletedProcess:
    """What `make wheelhouse` runs, with the requirements file named (the test's lab passes its code dir
    with -e, not in the inventory). The shared folder's wheels (torch) are hard-linked first, as a second
    `make wheelhouse` finds them, so only the requirements' wheels are downloaded."""
    wheelhouse.mkdir()
    for wheel in (REPO / "wheelhouse").glob("*.whl"):
        try:
            os.link(wheel, wheelhouse / wheel.name)
        except OSError:  # another file system
            shutil.copy2(wheel, wheelhouse / wheel.name)
    argv = [sys.executable, "-m", "ddplab.wheelhouse", "fill", "--dir", str(wheelhouse), "--python", "3.11",
            "--requirements", str(code / "requirements.txt")]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)


def plant_wheel(cluster, host: str, wheel: Path) -> None:
    """A stale or planted wheel in the node's copy of the wheelhouse (what a peer with write access could
    leave there), in a lab folder as an earlier prepare left it (its marker)."""
    marker = "This folder is a ddplab lab folder (ddplab_root); ddplab writes and prunes files in it."
    cluster.exec(host, ["sh", "-c", f"mkdir -p {WHEELS} && echo '{marker}' > /root/ddplab/.ddplab-lab && "
                                    f"base64 -d > {WHEELS}/{wheel.name}"],
                 input=base64.b64encode(wheel.read_bytes()).decode(), timeout=30, check=True)


def test_two_ranks_per_node_make_world_size_four(simlan2, lab, tmp_path, simlan_cluster):
    """Also: the requirements travel in the wheelhouse. six is in no Python of the nodes and they have no
    route to a package index, so the install can only come from the pushed wheels: the manifest's six
    1.17.0 by its sha256, not a newer six planted in the node's wheelhouse (the old --find-links install
    took it: `six>=1.16` allows it). A torch.py and a tokenize.py in node1's login folder (a user's scripts)
    stand in for nothing: the old code venv's torch check (an inline `python -c "import torch"`) and the old
    `python -m venv` that made it ran from there and failed."""
    try:
        for stray in ("torch", "tokenize"):
            planted = f"raise ImportError('a stray {stray}.py in the login folder')\n"
            simlan2.exec("node1", ["sh", "-c", f"cat > /root/{stray}.py"], input=planted, timeout=30,
                         check=True)
        code = tmp_path / "code"
        shutil.copytree(FIXTURES / "rank_probe", code)
        with (code / "requirements.txt").open("a") as f:
            f.write("six>=1.16\n")
        wheelhouse = tmp_path / "wheelhouse"
        filled = fill_requirements(code, wheelhouse)
        assert filled.returncode == 0, tail(filled)
        (tmp_path / "planted").mkdir()
        planted = pure_wheel(tmp_path / "planted", "six", "1.99.0", "PLANTED = True\n")
        for host in HOSTS:
            plant_wheel(simlan2, host, planted)
        extra = {**lab, "ddplab_wait": "true", "ddplab_run_id": "byo-nproc", "ddplab_code_dir": code,
                 "ddplab_nproc_per_node": 2, "ddplab_pip_requirements": "requirements.txt",
                 "ddplab_wheelhouse_dir": wheelhouse,
                 "ddplab_smoke_run": "false"}  # the seed's launch runs the smoke run; this tests the ranks
        # values with spaces go as JSON (-e k=v splits on spaces)
        more = {"ddplab_entrypoint": "-m probe", "ddplab_entrypoint_args": ["--tag", "two words"],
                "ddplab_collect_globs": ["out/*.txt"]}
        proc = playbook("launch.yml", "-e", json.dumps(more), inventory=simlan2.inventory_dir, timeout=600,
                        extra=extra)
        assert proc.returncode == 0, tail(proc)
        run = lab["ddplab_runs_dir"] / "byo-nproc"
        for host, ranks in (("node0", (0, 1)), ("node1", (2, 3))):
            log = (run / host / "launch.log").read_text()
            for rank in ranks:
                line = (f"probe rank {rank} world_size 4 local_rank {rank % 2} sum 10 "
                        "tag 'two words' numpy_ok True")
                assert line in log
                assert (run / host / "out" / f"rank{rank}.txt").read_text().strip() == line
            # the ranks ran in the code venv layered on the pinned Python, torch untouched
            assert node_python(simlan2, host) == "/root/ddplab/venv-code/bin/python"
            assert torch_version(simlan2, host, "/root/ddplab/venv-code/bin/python") == "2.13.0"
            # six came from the pushed wheel: the node resolves no index host
            assert simlan2.exec(host, ["getent", "hosts", "pypi.org"], timeout=30).returncode != 0
            six = simlan2.exec(host, ["/root/ddplab/venv-code/bin/python", "-c",
                                      "import six, sys; print(six.__version__, six.__file__)"], timeout=60)
            assert six.stdout.startswith("1.17.0 /root/ddplab/venv-code/"), six.stdout + six.stderr
            pushed = simlan2.exec(host, ["ls", WHEELS], timeout=30, check=True).stdout.split()
            assert "six-1.17.0-py2.py3-none-any.whl" in pushed
            assert not any(w.startswith("torch-") for w in pushed)  # the node's Python has the pin
            assert re.search(rf"{host}: pushing \d+ wheel\(s\), .* requirements.txt\) to {WHEELS}",
                             proc.stdout)
        assert "Install the requirements offline" in proc.stdout
        assert json.loads((run / "summary.json").read_text())["all_exited_zero"] is True

        prep = {k: v for k, v in extra.items() if k not in ("ddplab_wait", "ddplab_run_id")}
        again = playbook("prepare.yml", "-e", json.dumps(more), inventory=simlan2.inventory_dir, timeout=300,
                         extra=prep)
        assert again.returncode == 0, tail(again)
        assert {h: r["changed"] for h, r in recap(again).items()} == {"node0": 0, "node1": 0}, tail(again)
        assert "pushing 0 wheel(s)" in again.stdout
        check = playbook("prepare.yml", "--check", "--diff", "-e", json.dumps(more),
                         inventory=simlan2.inventory_dir, timeout=300, extra=prep)
        assert check.returncode == 0 and all(r["changed"] == 0 for r in recap(check).values()), tail(check)

        # a file changed since the fill: refused with the file and the fix; the index only when asked
        with (code / "requirements.txt").open("a") as f:
            f.write("# pinned\n")
        changed = playbook("prepare.yml", "-e", json.dumps(more), inventory=simlan2.inventory_dir,
                           timeout=300, extra=prep)
        assert changed.returncode != 0, tail(changed)
        assert re.search(rf"ddplab: error: node0: {code}/requirements.txt changed since make wheelhouse .*"
                         r"fix: make wheelhouse INV=<your inventory>", changed.stdout), tail(changed)
        assert "Traceback" not in changed.stdout + changed.stderr
        asked = playbook("prepare.yml", "-e", json.dumps({**more, "ddplab_pip_index_fallback": True}),
                         inventory=simlan2.inventory_dir, timeout=300, extra=prep)
        assert asked.returncode == 0, tail(asked)  # all is installed already: pip needs no index
        assert "ddplab: warning: node0:" in asked.stdout and "requirements.txt changed since" in asked.stdout
    finally:
        simlan_cluster.discard()  # ufw enabled, lab folders written: the next module gets fresh hosts
