"""The verdict's state: the inputs, the table of cells, and the helpers every check group uses.

A cell is ``{"status": ok | FAIL | skip | n/a, "detail": ..., "fix": <the command that fixes it>}``.
"""

from __future__ import annotations

import ipaddress

from ddplab.preflight.collect import Inputs
from ddplab.preflight.wheelhouse_fit import missing_wheel
from trainer.launch_contract import MASTER_PORT

CHECKS = ("inventory", "ssh", "python", "torch", "gloo", "dtype", "threads", "cpu_power", "memory", "disk",
          "code", "data", "sync_dirs", "iface", "hostname", "tcp_master", "tcp_peers", "master_port",
          "firewall", "stale_processes", "slurm", "gloo_smoke", "link")
OK, FAIL, SKIP, NA = "ok", "FAIL", "skip", "n/a"
# Probe errors that mean the node was never prepared (no code or no Python there).
NOT_PREPARED = ("No module named 'nodeprobe'", "No module named nodeprobe", "not prepared")
PREPARE_FIX = "run playbooks/prepare.yml (with -l {host} to prepare this node alone)"
GIB = 1 << 30


def loopback(addr: str | None) -> bool:
    try:
        return ipaddress.ip_address(str(addr)).is_loopback
    except ValueError:
        return str(addr) == "localhost"


def gib(n) -> str:
    return f"{n / GIB:.2f} GiB" if isinstance(n, (int, float)) else "?"


class Judge:
    def __init__(self, inputs: Inputs, manifest: dict | None, control_code: dict | None,
                 control_sync: dict | None = None, shard_bytes: dict[str, int] | None = None):
        self.inv = inputs.inventory
        self.hosts = {str(h): (v if isinstance(v, dict) else {}) for h, v in self.inv["hosts"].items()}
        # Nodes outside --limit: known from the inventory (rank, address), never probed.
        self.left_out = [str(h) for h in self.inv.get("left_out") or [] if str(h) in self.hosts]
        for h in self.left_out:
            self.hosts[h] = {"rank": (self.inv.get("ranks") or {}).get(h),
                             "addr": (self.inv.get("addrs") or {}).get(h),
                             "master": h == self.inv.get("master_host"), **self.hosts[h]}
        self.port = self.inv.get("master_port", MASTER_PORT)
        self.manifest = manifest
        self.shard_bytes = shard_bytes or {}  # {shard: bytes} of the control host's shards (the disk check)
        self.control_code = control_code or {}
        self.control_sync = control_sync or {}  # ddplab_sync_dirs: {dest: {"sha256", "files", "path"}}
        masters = self.masters()
        self.master = masters[0] if len(masters) == 1 else None
        self.all_local = all(v.get("local") for v in self.hosts.values())
        self.rows: dict[str, dict[str, dict]] = {h: {} for h in self.hosts}
        self.probes = inputs.probes
        self.probe_errors = inputs.errors

    def masters(self) -> list[str]:
        flagged = [h for h, v in self.hosts.items() if v.get("master")]
        if flagged:
            return flagged
        return [h for h, v in self.hosts.items() if v.get("rank") == 0]

    def addr(self, host: str) -> str:
        v = self.hosts.get(host, {})
        return str(v.get("addr") or v.get("ansible_host") or host)

    def setting(self, host: str, key: str):
        v = self.hosts.get(host, {})
        return v.get(key) if v.get(key) is not None else self.inv.get(key)

    def probe(self, host: str, name: str) -> dict | None:
        return self.probes.get(host, {}).get(name)

    def set(self, host: str, check: str, status: str, detail: str = "", fix: str = "",
            note: str = "") -> None:
        """note: "info" or "warning" for a passing cell worth a line under the table."""
        self.rows[host][check] = {"status": status, "detail": detail, "fix": fix}
        if note:
            self.rows[host][check]["note"] = note

    def fail(self, host: str, check: str, detail: str, fix: str = "") -> None:
        # several findings for one cell are joined, the first fix first
        cell = self.rows[host].get(check)
        if cell and cell["status"] == FAIL:
            cell["detail"] += "; " + detail
            if fix and fix not in cell["fix"]:
                cell["fix"] = (cell["fix"] + "; " + fix).strip("; ")
            return
        self.set(host, check, FAIL, detail, fix)

    def failed_anywhere(self, check: str) -> bool:
        return any(self.rows[x].get(check, {}).get("status") == FAIL for x in self.hosts)

    def reachable(self, host: str) -> bool:
        ssh = self.probe(host, "ssh")
        return not (ssh and ssh.get("ok") is False)

    def need(self, host: str, check: str, name: str) -> dict | None:
        """The probe's JSON, or None after marking the cell skip/FAIL."""
        data = self.probe(host, name)
        if (host, name) in self.probe_errors:
            self.fail(host, check, self.probe_errors[(host, name)],
                      f"run `python -m nodeprobe {name.replace('_', '-')}` on {host} to see its error")
            return None
        if data is None:
            self.set(host, check, SKIP, f"no {name}.json: probe not run")
            return None
        if data.get("ok") is False and data.get("error") and name not in ("gloo_smoke", "ssh"):
            fix = f"run `python -m nodeprobe {name.replace('_', '-')}` on {host}"
            if any(w in data["error"] for w in NOT_PREPARED):
                fix = f"re-run playbooks/prepare.yml (the node-side code or Python is missing on {host})"
            self.fail(host, check, f"probe {name} failed on {host}: {data['error']}", fix)
            return None
        return data

    def fp(self, host: str) -> dict | None:
        return self.probe(host, "fingerprint")

    def reference(self, getter):
        """(host, value) of the master's fingerprint value, else the first host that has one."""
        order = ([self.master] if self.master else []) + [h for h in self.hosts if h != self.master]
        for h in order:
            fp = self.fp(h)
            if fp:
                try:
                    value = getter(fp)
                except (KeyError, TypeError):
                    continue
                if value is not None:
                    return h, value
        return None, None

    def sharing(self, h: str) -> list[str]:
        """Hosts running on the same machine as h (inventory 'local' hosts share this machine)."""
        return [x for x in self.hosts if self.hosts[x].get("local")] if self.hosts[h].get("local") else [h]


def unprepared_reason(detail: str, host: str) -> str:
    """What a node's probe said is missing, without the words the verdict says itself: the node's line
    "ddplab: error: this node is not prepared: WHAT; fix: ..." (ddplab/node_command.py) becomes WHAT."""
    said = detail.split(f"failed on {host}: ", 1)[-1].removeprefix("ddplab: error: ")
    return said.removeprefix("this node is not prepared: ").split("; fix: ", 1)[0]


def fold_unprepared(j: Judge) -> list[str]:
    """One FAIL per node that was never prepared, not one per check: its first check that failed for
    that reason says so (with the probe's own words) and names the fix; its other checks that failed for
    the same reason become skip. Returns the hosts folded."""
    folded = []
    for h in j.hosts:
        cells = [(c, j.rows[h][c]) for c in CHECKS if c in j.rows[h] and j.rows[h][c]["status"] == FAIL
                 and any(w in j.rows[h][c]["detail"] for w in NOT_PREPARED)]
        if not cells:
            continue
        first, cell = cells[0]
        reason = unprepared_reason(cell["detail"], h)
        wheel = missing_wheel(reason, j.inv.get("wheelhouse_dir"))
        if wheel:
            j.set(h, first, FAIL, f"{h} is not prepared: {reason}; {wheel[0]}", wheel[1])
        else:
            j.set(h, first, FAIL, f"{h} is not prepared: {reason}", PREPARE_FIX.format(host=h))
        for check, _ in cells[1:]:
            j.set(h, check, SKIP, f"not checked: {h} is not prepared (see {first})")
        folded.append(h)
    return folded
