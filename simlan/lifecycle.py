"""Create a cluster (`up`), find it again (`load`) and remove it (`down`). Every name and PID it
creates is recorded in `<state>/cluster.json` before or as it is created, so `down` (and a failed
`up`) removes exactly what simlan made and nothing else."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from simlan import cpuquota, egress, freezer, inventory, memlimit, network, outsider, rootfs
from simlan.defaults import DEFAULT_INVENTORY, DEFAULT_SYN_RETRIES, READY_TIMEOUT
from simlan.errors import SimlanError
from simlan.hostinit import write_host_files
from simlan.hosts import Cluster, Host
from simlan.keep import keep_paths, keep_tmp_paths, venv_python
from simlan.probe import comm, ssh_answers, tail
from simlan.state import load as load_state
from simlan.state import locked, state_dir
from simlan.stockinit import write_stock_host_files
from simlan.system import children, kill_recorded, require, run, start_time, wait_gone

STOCK_PYTHON = "/usr/bin/python3"  # Debian 12's python3, Ansible's interpreter on stock hosts


def load(state: str | os.PathLike | None = None) -> Cluster | None:
    """The recorded cluster, or None."""
    data = load_state(state_dir(state))
    return Cluster.from_json(data) if data else None


def up(nodes: int, *, rate: str | None = None, cpus: str = "none",
       syn_retries: int = DEFAULT_SYN_RETRIES, force: bool = False,
       inventory_dir: str | os.PathLike | None = None, python: str | None = None,
       keep: tuple[str, ...] = (), state: str | os.PathLike | None = None,
       timeout: float = READY_TIMEOUT, stock: bool = False,
       cpu_quota: tuple[str, ...] | list[str] = (), mem_limit: tuple[str, ...] | list[str] = (),
       release: tuple[str, ...] | list[str] = ()) -> Cluster:
    """Create hosts node0..node<nodes-1> and return the cluster. If the same cluster is already
    up and healthy it is returned as is (`.reused` is True); a different one needs `force`.
    `stock`: hosts that look like a fresh Debian 12 install (simlan.stockinit); `cpu_quota`:
    ["node1=50", ...], a host at that percent of one core (simlan.cpuquota); `mem_limit`: ["node1=1536M",
    ...], a host with that much memory (simlan.memlimit); `release`: ["node1=trixie", ...], a stock host of
    another Debian release (simlan.rootfs)."""
    tools = require()
    if not 1 <= nodes <= network.MAX_HOSTS:
        raise SimlanError(f"--nodes must be between 1 and {network.MAX_HOSTS}, got {nodes}", code=2)
    if cpus not in ("none", "auto"):
        raise SimlanError(f"--cpus must be auto or none, got {cpus!r}", code=2)
    if not 1 <= syn_retries <= 10:
        raise SimlanError(f"--syn-retries must be between 1 and 10, got {syn_retries}", code=2)
    quotas = cpuquota.parse(cpu_quota, [network.host_name(i) for i in range(nodes)])
    if quotas:
        cpuquota.backend()  # fails early, with a message, when the kernel has no cpu controller
    limits = memlimit.parse(mem_limit, [network.host_name(i) for i in range(nodes)])
    releases = rootfs.parse_releases(release, [network.host_name(i) for i in range(nodes)])
    if releases and not stock:
        raise SimlanError("--release is for stock hosts (their own root filesystem); add --stock", code=2)
    if limits:
        memlimit.backend()
    sdir = state_dir(state)
    inv = Path(inventory_dir or DEFAULT_INVENTORY).resolve()
    python = python or (STOCK_PYTHON if stock else venv_python())
    if not stock and not os.access(python, os.X_OK):
        raise SimlanError(f"--python {python}: not an executable file; give the Python the hosts "
                          "should run (default: the venv Python running simlan)", code=2)
    with locked(sdir):
        existing = load(sdir)
        if existing:
            wanted = (nodes, rate, cpus, syn_retries, str(inv), python, stock, quotas, limits, releases)
            have = (len(existing.hosts), existing.rate, existing.cpus, existing.syn_retries,
                    str(existing.inventory_dir), existing.python, existing.stock, existing.cpu_quota,
                    existing.mem_limit, existing.releases)
            if not force:
                if wanted == have and existing.healthy():
                    existing.reused = True
                    if not (inv / "hosts.yml").exists():  # removed by hand (git clean): write it again
                        _write_inventory(existing)
                    return existing
                why = "unhealthy" if wanted == have else f"{len(existing.hosts)} hosts, rate " \
                    f"{existing.rate or 'unshaped'}, cpus {existing.cpus}" \
                    f"{', stock' if existing.stock else ''}" \
                    f"{''.join(f', {h} at {p}%' for h, p in existing.cpu_quota.items())}" \
                    f"{''.join(f', {h} {b >> 20}M' for h, b in existing.mem_limit.items())}" \
                    f"{''.join(f', {h} {r}' for h, r in existing.releases.items())}"
                raise SimlanError(
                    f"a cluster is already up ({why}; state in {sdir}); run `python -m simlan down` "
                    "first, or `python -m simlan up --force` to recreate it", code=2)
            _teardown(existing, tools)
        return _create(sdir, tools, nodes=nodes, rate=rate, cpus=cpus, syn_retries=syn_retries,
                       inv=inv, python=python, keep=keep, timeout=timeout, stock=stock, quotas=quotas,
                       limits=limits, releases=releases)


def down(state: str | os.PathLike | None = None) -> bool:
    """Remove the recorded cluster (processes by recorded PID, namespaces, bridge, inventory files,
    state). Returns False when there was nothing to remove. Safe to call twice."""
    tools = require()
    sdir = state_dir(state)
    with locked(sdir):
        cluster = load(sdir)
        if cluster is None:
            return False
        _teardown(cluster, tools)
        return True


# ---- internals ----

def _write_inventory(cluster: Cluster) -> None:
    inventory.write(cluster.inventory_dir, [{"name": h.name, "addr": h.addr} for h in cluster.hosts],
                    cluster.key, cluster.python, cluster.state_dir / "ansible-cp", user=cluster.user,
                    become_password=cluster.become_password)


def _create(sdir: Path, tools: dict[str, str], *, nodes: int, rate: str | None, cpus: str,
            syn_retries: int, inv: Path, python: str, keep: tuple[str, ...], timeout: float,
            stock: bool, quotas: dict[str, int], limits: dict[str, int], releases: dict[str, str]) -> Cluster:
    ip, tc = tools["ip"], tools["tc"]
    # Before anything exists: the cache build (once, about a minute) and the checks of --stock.
    names = [network.host_name(i) for i in range(nodes)]
    suites = {n: releases.get(n, rootfs.SUITE) for n in names}
    lowers = {s: rootfs.ensure(log=lambda m: print(m, file=sys.stderr), suite=s)
              for s in sorted(set(suites.values()))} if stock else {}
    resolv_conf = Path("/etc/resolv.conf").read_text() if stock else ""
    allowed_egress = egress.plan(resolv_conf) if stock else None
    network.check_free(ip, names)
    # Leftovers of a crashed `up` (no cluster.json): only simlan's own files, nothing running.
    shutil.rmtree(sdir / "hosts", ignore_errors=True)
    sdir.mkdir(parents=True, exist_ok=True)
    real_home = pwd.getpwuid(0).pw_dir
    allowed = sorted(os.sched_getaffinity(0))
    hosts = [Host(name=n, addr=network.host_addr(i), dir=str(sdir / "hosts" / n),
                  cpu=allowed[i % len(allowed)] if cpus == "auto" else None)
             for i, n in enumerate(names)]
    cluster = Cluster(state_dir=sdir, hosts=hosts, inventory_dir=inv, python=python, rate=rate,
                      cpus=cpus, syn_retries=syn_retries, real_home=real_home,
                      created_by=os.getpid(), created_at=time.time(), stock=stock,
                      become_password=secrets.token_urlsafe(12) if stock else None, cpu_quota=quotas,
                      mem_limit=limits, releases=releases)
    cluster.save()  # recorded before anything exists, so a failed `up` can be undone by `down`
    try:
        for f in (cluster.key, cluster.key.with_suffix(".pub")):
            f.unlink(missing_ok=True)
        run([tools["ssh-keygen"], "-q", "-t", "ed25519", "-N", "", "-C", "simlan-client",
             "-f", str(cluster.key)], what="ssh-keygen (client key)")
        pubkey = cluster.key.with_suffix(".pub").read_text()
        lan = [(x.name, x.addr) for x in hosts]
        if stock:
            for h in hosts:
                write_stock_host_files(host=h.name, addr=h.addr, host_dir=Path(h.dir), all_hosts=lan,
                                       client_pubkey=pubkey, password=cluster.become_password,
                                       lower=lowers[suites[h.name]], resolv_conf=resolv_conf,
                                       syn_retries=syn_retries)
        else:
            keep_list = keep_paths(real_home, python, keep)
            keep_tmp = keep_tmp_paths(python, keep)
            for h in hosts:
                write_host_files(host=h.name, addr=h.addr, host_dir=Path(h.dir), all_hosts=lan,
                                 client_pubkey=pubkey, real_home=real_home, keep=keep_list,
                                 keep_tmp=keep_tmp, syn_retries=syn_retries, ssh_keygen=tools["ssh-keygen"],
                                 cgroup_fs=memlimit.mount_spec() if h.name in limits else "")
        network.create_bridge(ip)
        for h in hosts:
            network.create_host_link(ip, tc, h.name, h.addr, rate)
            if stock:
                egress.route_default(ip, network.netns_name(h.name))
        if stock:
            cluster.egress = egress.add(allowed_egress)
            cluster.save()
        for h in hosts:
            if h.name in quotas:
                h.cgroup = cpuquota.create(h.name, quotas[h.name])
                cluster.save()
            if h.name in limits:
                h.mem_cgroup = memlimit.create(h.name, limits[h.name])
                cluster.save()
        for h in hosts:
            _start_host(cluster, h, tools)
            cluster.save()
        _wait_ready(cluster, timeout)
        _write_inventory(cluster)
        cluster.inventory_written = True
        cluster.save()
    except BaseException:
        try:
            _teardown(cluster, tools)
        except SimlanError as cleanup_error:
            print(f"simlan: warning: cleanup after the failed up: {cleanup_error}", file=sys.stderr)
        raise
    return cluster


def _start_host(cluster: Cluster, h: Host, tools: dict[str, str]) -> None:
    """Start the host's PID 1 (init.sh) in new mount/PID/UTS namespaces inside its netns."""
    argv = [tools["ip"], "netns", "exec", network.netns_name(h.name),
            tools["unshare"], "--mount", "--pid", "--uts", "--fork", "--mount-proc",
            "--propagation", "private", "--kill-child", tools["bash"], str(Path(h.dir) / "init.sh")]
    place = cluster.pin(h.name)  # CPU and cgroup: inherited by PID 1 and every process of the host

    log_path = Path(h.dir) / "init.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=cluster.host_env(h.name),
                                preexec_fn=place)
    h.unshare_pid, h.unshare_start = proc.pid, start_time(proc.pid)
    deadline = time.monotonic() + 5
    while True:
        if proc.poll() is not None:
            raise SimlanError(f"{h.name}: host init exited at once (exit {proc.returncode}): "
                              f"{tail(log_path)}")
        kids = children(proc.pid) if comm(proc.pid) == "unshare" else []
        if kids:
            h.pid1, h.pid1_start = kids[0], start_time(kids[0])
            return
        if time.monotonic() > deadline:
            raise SimlanError(f"{h.name}: unshare did not start the host's PID 1 within 5 s")
        time.sleep(0.005)


def _wait_ready(cluster: Cluster, timeout: float) -> None:
    """Wait until every host's sshd greets on port 22, or fail naming the host and its log."""
    deadline = time.monotonic() + timeout
    pending = list(cluster.hosts)
    while pending:
        for h in list(pending):
            if not h.alive:
                raise SimlanError(f"{h.name}: host init failed: {tail(Path(h.dir) / 'init.log')}")
            if ssh_answers(h.addr, timeout=0.2):
                pending.remove(h)
        if pending:
            if time.monotonic() > deadline:
                h = pending[0]
                raise SimlanError(
                    f"{h.name}: sshd did not answer on {h.addr}:22 within {timeout:g} s; see "
                    f"{cluster.sshd_log(h.name)} ({tail(cluster.sshd_log(h.name), 1)})")
            time.sleep(0.02)


def _teardown(cluster: Cluster, tools: dict[str, str]) -> None:
    """Remove everything recorded for `cluster`, tolerating what is already gone."""
    ip = tools["ip"]
    for h in cluster.hosts:  # SIGKILL of PID 1 ends every process of the host
        freezer.thaw(h.freezer)  # a v1-frozen task keeps a SIGKILL pending until it thaws
        if h.link:  # the link delayer (simlan.wifi) runs in the host's namespace, outside its PID namespace
            kill_recorded(h.link.get("pid"), h.link.get("start"))
        kill_recorded(h.pid1, h.pid1_start)
    for h in cluster.hosts:
        wait_gone(h.pid1, h.pid1_start)
        # unshare ignores SIGTERM while it waits; it exits when its child does. If PID 1 was never
        # found (a failed up), kill unshare itself: --kill-child then takes the child with it.
        if not wait_gone(h.unshare_pid, h.unshare_start, timeout=2):
            kill_recorded(h.unshare_pid, h.unshare_start)
            wait_gone(h.unshare_pid, h.unshare_start)
    for h in cluster.hosts:
        network.delete_netns(ip, h.name)
    if cluster.outsider:
        network.delete_netns(ip, outsider.NAME)
    network.delete_bridge(ip)
    egress.remove(cluster.egress)
    for h in cluster.hosts:
        cpuquota.remove(h.cgroup)
        memlimit.remove(h.mem_cgroup)
        freezer.remove(h.freezer)
    if cluster.inventory_written:
        inventory.remove(cluster.inventory_dir)
    shutil.rmtree(cluster.state_dir, ignore_errors=True)
