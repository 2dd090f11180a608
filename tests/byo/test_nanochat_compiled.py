"""docs/your-code.md's nanochat section with compilation on (issue 47): the docs' checkout and inventory block
without the TORCH_COMPILE_OVERRIDE_BACKENDS line, so nanochat's torch.compile generates and builds inductor's
C++ kernels, trained by launch.yml on 2 simulated hosts with the smoke run on. The compile is paid once per
lab: the smoke run compiles cold on the master, launch packs what it built (the seed), ships it to node1 and
unpacks it into each node's rank folder, so both ranks' first step loads it.

nanochat's smallest configuration that compiles the real model and its fused optimizer steps (--depth=1
--max-seq-len=64, as bench/nanochat_compile_race.py), 4 steps. Still a cold compile by 2 smoke ranks on one
core each: minutes (95 s to the first step for 1 rank at low load; bench/results/nanochat_compile_race:
225-368 s for 2 ranks at load 9 to 16), past CI's budget, so it runs only when asked:
DDPLAB_NANOCHAT_COMPILED=1 SIMLAN_LAB=<n> .venv/bin/pytest -s tests/byo/test_nanochat_compiled.py.
CI runs the same section eager (tests/byo/test_nanochat_simlan.py) and the seed's parts
(tests/byo/test_compile_cache.py)."""

from __future__ import annotations

import json
import math
import os
import re
import time

import pytest

from bench.nanochat_checkout import APPLY, ddplab_path, git, shell, smallest_args
from tests.byo import test_nanochat_simlan as nc
from tests.helpers.playbooks import playbook, tail

checkout, lab = nc.checkout, nc.lab  # the docs' checkout and inventory, the lab's folders (module fixtures)

ASKED = os.environ.get("DDPLAB_NANOCHAT_COMPILED") == "1"
pytestmark = [pytest.mark.slow, pytest.mark.simlan,
              pytest.mark.skipif(not ASKED, reason="DDPLAB_NANOCHAT_COMPILED=1 runs it (nanochat compiled "
                                 "cold on 2 simulated hosts: 6 minutes at load 4 to 8; docs/your-code.md)")]

OVERRIDE_LINE = re.compile(r"^\s*TORCH_COMPILE_OVERRIDE_BACKENDS:.*\n", re.M)
ARGS_LINE = re.compile(r"^ddplab_entrypoint_args: \[.*?\]\n", re.M | re.S)
ITERATIONS = 4
SMALLEST = smallest_args(ITERATIONS)  # bench/nanochat_compile_race.py's smallest run
CACHE = "/root/ddplab/compile-cache"  # the lab's compile cache on each node (ddplab_lab.compile_cache)
RUN = "nanochat-compiled"
LAUNCH_TIMEOUT = 2700  # a cold compile by 2 ranks sharing a loaded core
SHIPPED = re.compile(r"the master's torch\.compile cache \((\d+) files, ([\d.]+) MiB, warmed by the smoke "
                     r"run\) goes to ([\w, ]+?): their ranks' first step loads it")


def node_files(cluster, host: str, pattern: str) -> list[str]:
    proc = cluster.exec(host, ["sh", "-c", f"cd {CACHE} && find . -type f -name '{pattern}' | sort"],
                        timeout=60)
    return proc.stdout.split()


@pytest.fixture(scope="module")
def compiled(checkout, lab):
    """The docs' section as typed, the gloo patch applied, without the eager line, in the smallest
    configuration: one launch.yml -e ddplab_wait=true with the smoke run on."""
    shell(ddplab_path(APPLY), checkout["code"])
    git(checkout["code"], "commit", "-qam", "gloo patch (ddplab)")
    path = checkout["inventory"] / "group_vars" / "all" / "code.yml"
    text = path.read_text()
    assert len(OVERRIDE_LINE.findall(text)) == 1 and len(ARGS_LINE.findall(text)) == 1, text
    text = ARGS_LINE.sub(f"ddplab_entrypoint_args: {json.dumps(SMALLEST)}\n", OVERRIDE_LINE.sub("", text))
    path.write_text(text)
    load, started = os.getloadavg()[0], time.monotonic()
    proc = playbook("launch.yml", "-e", "ddplab_wait=true", inventory=checkout["inventory"],
                    timeout=LAUNCH_TIMEOUT, extra={**lab, "ddplab_wheelhouse_dir": checkout["wheelhouse"],
                                                   "ddplab_run_id": RUN},
                    env={"DDPLAB_TIMING": "12"})
    print(f"\n{RUN}: launch.yml {round(time.monotonic() - started)} s (load {load:.1f} to "
          f"{os.getloadavg()[0]:.1f}); module {round(time.monotonic() - checkout['started'])} s")
    return proc


def test_compiled_nanochat_trains_on_two_hosts_with_one_compile(checkout, lab, compiled):
    proc = compiled
    assert proc.returncode == 0, tail(proc)
    assert "it trains as one DDP run" in proc.stdout, tail(proc)
    run = lab["ddplab_runs_dir"] / RUN
    for host, rank in zip(nc.HOSTS, (0, 1), strict=True):
        assert f"rank {rank} exited with code 0" in (run / host / "launch.log").read_text()
    log = (run / "node0" / "launch.log").read_text()
    steps = [int(m[0]) for m in nc.STEP_LINE.findall(log)]
    assert steps == list(range(ITERATIONS)), steps
    losses = [float(x) for x in re.findall(r"^step \d+/\d+ .*?\| loss: (\S+) \|", log, re.M)]
    assert len(losses) == ITERATIONS and all(math.isfinite(x) and x > 0 for x in losses), losses
    summary = json.loads((run / "summary.json").read_text())
    # the report reads nanochat's lines: its last step line is step ITERATIONS - 1 (no evaluation after it)
    assert summary["all_exited_zero"] is True and summary["last_step"] == ITERATIONS - 1, summary
    assert math.isfinite(summary["loss_last"]) and summary["loss_last"] > 0, summary

    # compiled for real: inductor's code generation built kernels (the eager line builds none: "no
    # torch.compile cache to ship"), the smoke run's seed went to both nodes and was unpacked into each
    # node's rank folder with the same bytes
    shipped = SHIPPED.search(proc.stdout)
    assert shipped and int(shipped[1]) > 0 and shipped[3] == "node0, node1", tail(proc)
    cluster = checkout["cluster"]
    libraries = {host: node_files(cluster, host, "*.so") for host in nc.HOSTS}
    assert [f for f in libraries["node0"] if f.startswith("./smoke-rank")], libraries["node0"]
    for host in nc.HOSTS:
        assert [f for f in libraries[host] if f.startswith("./local0/")], (host, libraries[host])
    seeds = {host: cluster.exec(host, ["sha256sum", f"{CACHE}/seed.tar"], timeout=60,
                                check=True).stdout.split()[0] for host in nc.HOSTS}
    assert seeds["node0"] == seeds["node1"], seeds
    print(f"compile cache shipped: {shipped[1]} files, {shipped[2]} MiB; libraries per node "
          f"{ {h: len(v) for h, v in libraries.items()} }; losses {losses}")
