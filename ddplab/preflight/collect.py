"""The verdict's input: the preflight role's bundle of registered Ansible results, held in memory.

The role sends one JSON object on stdin (``python -m ddplab preflight-verdict``)::

    {"inventory": {"master_port": 29500, "torch_version": "<the pin>", "threads": 2,
                   "hosts": {"node0": {"rank": 0, "addr": "10.77.0.10", "master": true, "local": false}}},
     "smoke_skipped": null or "why the gloo smoke test was not run",
     "results": {"ssh":        {host: <ping result: unreachable/msg>},
                 "gather":     {host: <command result: rc/stdout/stderr> of `nodeprobe preflight-gather`>},
                 "tcp":        {host: <... of `nodeprobe preflight-connect`>},
                 "gloo_smoke": {host: <... of `nodeprobe preflight-smoke`>},
                 "outside":    {left-out host: <... of `nodeprobe preflight-outside`, delegated>},
                 "outside_ssh": <... of the control host's `nodeprobe connect` to their SSH ports>}}

Per host it becomes one JSON object per probe (ssh, fingerprint, resolve, iface, lab_processes,
port_holder, tcp_master, tcp_peers, gloo_smoke). A skipped task (``"skipped": true``) or a missing
host gives nothing (the verdict shows "not run"); a probe that printed no JSON becomes ``{"ok":
false, "error": <its last stderr line>}``. The connect target named ``@master`` is the master port.
A node left out by --limit has only ``outside``: its ssh (answered or not) and its connects to the
play's nodes (tcp_master, tcp_peers).

``dump`` writes those objects as a folder (``inventory.json``, ``<host>/<probe>.json``) for
debugging; ``load_dir`` reads such a folder back, so a dump can be judged again.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from nodeprobe.preflight_node import last_json

MASTER_TARGET = "@master"
FROM_GATHER = ("fingerprint", "resolve", "iface", "lab_processes", "firewall", "port_holder")


class InputError(Exception):
    """The verdict's own input is unusable: exit 2 with this one line."""


@dataclass
class Inputs:
    inventory: dict
    probes: dict[str, dict[str, dict]] = field(default_factory=dict)  # host -> probe name -> JSON
    errors: dict[tuple[str, str], str] = field(default_factory=dict)  # (host, probe) -> unreadable
    control_code: dict = field(default_factory=dict)  # the dump folder's control.json "code"


def failure(res: dict) -> str:
    """One line saying why a node command printed no JSON."""
    lines = [ln.strip() for ln in (res.get("stderr") or "").splitlines() if ln.strip()]
    if lines:
        return lines[-1][:400]
    return str(res.get("msg") or f"exit code {res.get('rc')} and no output")[:400]


def _ran(res) -> bool:
    return isinstance(res, dict) and not res.get("skipped") and not res.get("unreachable")


def _hosts(inv, where: str) -> dict:
    hosts = inv.get("hosts") if isinstance(inv, dict) else None
    if not isinstance(hosts, dict) or not hosts:
        raise InputError(f"{where} lists no hosts: expected {{\"hosts\": {{\"node0\": {{...}}}}}}")
    return hosts


def host_probes(spec: dict, results: dict, host: str, smoke_skipped) -> dict[str, dict]:
    """The probe objects of one host from its registered results."""
    out: dict[str, dict] = {}

    def result(kind: str):
        return (results.get(kind) or {}).get(host)

    ssh = result("ssh")
    outside = result("outside")
    if isinstance(outside, dict):
        return outside_probes(outside)
    if isinstance(ssh, dict) and ssh.get("unreachable"):
        return {"ssh": {"ok": False, "error": str(ssh.get("msg") or "unreachable").strip()}}
    if _ran(ssh):
        out["ssh"] = {"ok": True}
    g = result("gather")
    if _ran(g):
        data = last_json(g.get("stdout"))
        if data and data.get("probe") == "gather" and isinstance(data.get("results"), dict):
            found = data["results"]
            out.update({n: found[n] for n in FROM_GATHER if isinstance(found.get(n), dict)})
            if isinstance(found.get("slurm"), dict):  # ddplab_scheduler slurm only
                out["slurm"] = found["slurm"]
        else:
            err = (data or {}).get("error") or failure(g)
            names = FROM_GATHER if (isinstance(spec, dict) and spec.get("master")) else FROM_GATHER[:-1]
            out.update({n: {"ok": False, "error": err} for n in names})
    t = result("tcp")
    if _ran(t):
        out.update(connect_probes(last_json(t.get("stdout")), t))
    s = result("gloo_smoke")
    if smoke_skipped:
        out["gloo_smoke"] = {"probe": "gloo-smoke", "skipped": True, "reason": str(smoke_skipped)}
    elif _ran(s):
        data = last_json(s.get("stdout"))
        out["gloo_smoke"] = data if data and data.get("probe") == "gloo-smoke" else {
            "probe": "gloo-smoke", "ok": False, "phase": "start", "error": failure(s)}
    return out


def connect_probes(data: dict | None, res: dict) -> dict[str, dict]:
    """A connect output as tcp_master (the ``@master`` target) and tcp_peers (the others)."""
    if not (data and isinstance(data.get("targets"), dict)):
        return {"tcp_peers": {"ok": False, "error": (data or {}).get("error") or failure(res)}}
    targets = dict(data["targets"])
    master = targets.pop(MASTER_TARGET, None)
    out = {"tcp_master": master} if master is not None else {}
    return {**out, "tcp_peers": {**data, "targets": targets}}


def outside_probes(res: dict) -> dict[str, dict]:
    """A left-out node's ``preflight-outside`` result: did it answer over SSH, and its connects."""
    if res.get("unreachable"):
        return {"ssh": {"ok": False, "left_out": True, "error": str(res.get("msg") or "unreachable").strip()}}
    if not _ran(res):
        return {}
    data = last_json(res.get("stdout"))
    if data and data.get("probe") == "outside" and isinstance(data.get("connect"), dict):
        return {"ssh": {"ok": True, "left_out": True}, **connect_probes(data["connect"], res)}
    return {"ssh": {"ok": True, "left_out": True},
            "tcp_peers": {"ok": False, "error": (data or {}).get("error") or failure(res)}}


def silent_ssh(res) -> dict[str, str]:
    """{left-out host: why} for the SSH ports the control host could not connect to (not asked then)."""
    data = last_json(res.get("stdout")) if _ran(res) else None
    targets = (data or {}).get("targets")
    if not isinstance(targets, dict):
        return {}
    return {str(h): f"its SSH port {t.get('host')}:{t.get('port')} did not answer "
                    f"({t.get('result')}: {t.get('error')})"
            for h, t in targets.items() if isinstance(t, dict) and not t.get("ok")}


def from_bundle(bundle) -> Inputs:
    if not isinstance(bundle, dict) or not isinstance(bundle.get("inventory"), dict):
        raise InputError("the bundle has no \"inventory\" object")
    inv = bundle["inventory"]
    hosts = _hosts(inv, "the bundle's inventory")
    results = bundle.get("results") or {}
    if not isinstance(results, dict):
        raise InputError("the bundle's \"results\" is not an object")
    probes = {str(h): host_probes(spec, results, h, bundle.get("smoke_skipped")) for h, spec in hosts.items()}
    # The smoke test runs on every node or on none: a node that could not even report the skip (its
    # probes printed nothing) shows the same reason as the others.
    skips = [p["gloo_smoke"] for p in probes.values() if (p.get("gloo_smoke") or {}).get("skipped")]
    skip = skips[0] if skips else None
    left_out = set(map(str, inv.get("left_out") or []))
    silent = silent_ssh(results.get("outside_ssh"))
    for h in left_out & set(probes):
        if not probes[h] and h in silent:
            probes[h] = {"ssh": {"ok": False, "left_out": True, "error": silent[h]}}
    for h, p in probes.items():
        answered = (p.get("ssh") or {}).get("ok") is not False
        if skip and "gloo_smoke" not in p and answered and h not in left_out:
            p["gloo_smoke"] = skip
    return Inputs(inv, probes)


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def dump(inputs: Inputs, out: Path) -> None:
    """Write the inputs as a folder (emptied first; a folder that is not a former dump is refused)."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise InputError(f"--dump {out} exists and is not a folder")
        if any(out.iterdir()) and not (out / "inventory.json").exists():
            raise InputError(f"--dump {out} holds other files (no inventory.json); choose an empty folder")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _write(out / "inventory.json", inputs.inventory)
    for host in inputs.inventory["hosts"]:
        (out / str(host)).mkdir()
        for name, data in inputs.probes.get(str(host), {}).items():
            _write(out / str(host) / f"{name}.json", data)


def load_dir(folder: Path) -> Inputs:
    """Read a dump folder (every file optional except inventory.json)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"--in {folder} is not a folder of probe results")
    inv_path = folder / "inventory.json"
    try:
        inv = json.loads(inv_path.read_text())
    except FileNotFoundError:
        raise InputError(f"{inv_path} is missing: a dump folder starts with it") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{inv_path} is not valid JSON: {e}") from None
    inputs = Inputs(inv)
    for host in _hosts(inv, str(inv_path)):
        probes = inputs.probes.setdefault(str(host), {})
        for path in sorted((folder / str(host)).glob("*.json")):
            try:
                data = json.loads(path.read_text())
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as e:
                why = f"{path} is unreadable ({e}); the probe printed no JSON"
                inputs.errors[(str(host), path.stem)] = why
                continue
            probes[path.stem] = data
    cpath = folder / "control.json"
    if cpath.exists():
        try:
            inputs.control_code = json.loads(cpath.read_text()).get("code") or {}
        except (OSError, ValueError, AttributeError) as e:
            raise InputError(f"{cpath} is not valid JSON: {e}") from None
    return inputs
