"""Control side: the preflight role's bundle of registered Ansible results -> the verdict's input folder.

The role sends one JSON object (``python -m nodeprobe.verdict --bundle -``) so that no file has to
be fetched per probe::

    {"inventory": {... as DIR/inventory.json ...},
     "smoke_skipped": null or "why the gloo smoke test was not run",
     "results": {"ssh":        {host: <ping result: unreachable/msg>},
                 "gather":     {host: <command result: rc/stdout/stderr> of `nodeprobe gather`>},
                 "tcp":        {host: <... of `nodeprobe connect --target ...`>},
                 "gloo_smoke": {host: <... of `nodeprobe gloo-smoke`>}}}

A skipped task (``"skipped": true``) or a missing host writes nothing (the verdict shows "not
run"); a probe that printed no JSON becomes ``{"ok": false, "error": <its last stderr line>}``.
The connect target named ``@master`` is the master port (tcp_master.json), the others are peers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

MASTER_TARGET = "@master"
FROM_GATHER = ("fingerprint", "resolve", "iface", "lab_processes", "port_holder")


class BundleError(Exception):
    """The bundle itself is unusable: the verdict exits 2 with this one line."""


def last_json(text: str | None) -> dict | None:
    """The last line of ``text`` that is a JSON object (probes print exactly one)."""
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def failure(res: dict) -> str:
    """One line saying why a node command printed no JSON."""
    lines = [ln.strip() for ln in (res.get("stderr") or "").splitlines() if ln.strip()]
    if lines:
        return lines[-1][:400]
    return str(res.get("msg") or f"exit code {res.get('rc')} and no output")[:400]


def _ran(res) -> bool:
    return isinstance(res, dict) and not res.get("skipped") and not res.get("unreachable")


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def fresh_dir(out: Path) -> None:
    """Empty ``out`` for a new verdict; refuse a folder that is not a former input folder."""
    if out.exists():
        if not out.is_dir():
            raise BundleError(f"--in {out} exists and is not a folder")
        if any(out.iterdir()) and not (out / "inventory.json").exists():
            raise BundleError(f"--in {out} holds other files (no inventory.json); choose an empty folder")
        shutil.rmtree(out)
    out.mkdir(parents=True)


def unpack(bundle: dict, out: Path) -> None:
    if not isinstance(bundle, dict) or not isinstance(bundle.get("inventory"), dict):
        raise BundleError("the bundle has no \"inventory\" object")
    inv = bundle["inventory"]
    hosts = inv.get("hosts")
    if not isinstance(hosts, dict) or not hosts:
        raise BundleError("the bundle's inventory lists no hosts")
    results = bundle.get("results") or {}
    if not isinstance(results, dict):
        raise BundleError("the bundle's \"results\" is not an object")
    fresh_dir(out)
    _write(out / "inventory.json", inv)

    def result(kind: str, host: str):
        return (results.get(kind) or {}).get(host)

    for host, spec in hosts.items():
        d = out / host
        d.mkdir()
        ssh = result("ssh", host)
        if isinstance(ssh, dict) and ssh.get("unreachable"):
            _write(d / "ssh.json", {"ok": False, "error": str(ssh.get("msg") or "unreachable").strip()})
            continue
        if _ran(ssh):
            _write(d / "ssh.json", {"ok": True})

        g = result("gather", host)
        if _ran(g):
            data = last_json(g.get("stdout"))
            if data and data.get("probe") == "gather" and isinstance(data.get("results"), dict):
                for name in FROM_GATHER:
                    if isinstance(data["results"].get(name), dict):
                        _write(d / f"{name}.json", data["results"][name])
            else:
                err = (data or {}).get("error") or failure(g)
                names = FROM_GATHER if (isinstance(spec, dict) and spec.get("master")) else FROM_GATHER[:-1]
                for name in names:
                    _write(d / f"{name}.json", {"ok": False, "error": err})

        t = result("tcp", host)
        if _ran(t):
            data = last_json(t.get("stdout"))
            if data and isinstance(data.get("targets"), dict):
                targets = dict(data["targets"])
                master = targets.pop(MASTER_TARGET, None)
                if master is not None:
                    _write(d / "tcp_master.json", master)
                _write(d / "tcp_peers.json", {**data, "targets": targets})
            else:
                _write(d / "tcp_peers.json", {"ok": False, "error": (data or {}).get("error") or failure(t)})

        s = result("gloo_smoke", host)
        if bundle.get("smoke_skipped"):
            _write(d / "gloo_smoke.json", {"probe": "gloo-smoke", "skipped": True,
                                           "reason": str(bundle["smoke_skipped"])})
        elif _ran(s):
            data = last_json(s.get("stdout"))
            if data and data.get("probe") == "gloo-smoke":
                _write(d / "gloo_smoke.json", data)
            else:
                _write(d / "gloo_smoke.json", {"probe": "gloo-smoke", "ok": False, "phase": "start",
                                               "error": failure(s)})
