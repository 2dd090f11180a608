"""The preflight role's three node steps, each driven by one JSON spec on stdin (no shell, no Jinja).

    python -m nodeprobe preflight-gather  < spec   # every single-node probe (`gather`)
    python -m nodeprobe preflight-connect < spec   # the master port and every peer's listener
    python -m nodeprobe preflight-smoke   < spec   # the gloo smoke test, or only clean up after gather

The spec is the role's ``preflight_spec`` (this node, the master, the hosts that answered SSH, lab
folders, the run's settings), plus ``addrs`` and ``peers`` (every answering host's address and its
``gather`` output) for connect, and ``gather`` (this node's output) and ``gate`` (the control host's
``{"smoke": bool, "reason": str}``) for smoke. The decisions (master or not, which targets, smoke or
skip) are the pure functions below; each step then runs an ordinary nodeprobe command line.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

MASTER_TARGET = "@master"


class SpecError(ValueError):
    """The spec is unusable: the command exits 2 with this one line."""


def flag(value) -> bool:
    """Ansible may hand booleans over as text."""
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


def last_json(text) -> dict | None:
    """The last line of ``text`` that is a JSON object (probes print exactly one), or None."""
    for line in reversed(str(text or "").splitlines()):
        try:
            value = json.loads(line.strip())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def is_master(spec: dict) -> bool:
    return spec["host"] == spec["master"]


def gather_argv(spec: dict) -> list[str]:
    """``gather``'s command line: the master also reads (and then holds) the master port."""
    code_dir = Path(spec["code_dir"])
    argv = ["gather", "--master", str(spec["master_addr"]), "--root", str(spec["root"]),
            "--listen-seconds", str(spec.get("listen_seconds", 60)), "--world", str(int(spec["world"])),
            "--trainer-args", json.dumps([str(a) for a in spec.get("trainer_args") or []])]
    if flag(spec.get("local")):
        argv.append("--shared")
    if is_master(spec):
        peers = [h for h in spec.get("up") or [] if h != spec["host"]]
        argv += ["--master-port", str(int(spec["master_port"])), "--expect", str(len(peers))]
    if flag(spec.get("has_data")):
        argv += ["--data", str(spec["data_dir"])]
    if int(spec.get("threads") or 0) > 0:
        argv += ["--threads", str(int(spec["threads"]))]
    trees = list(spec.get("code_trees") or [])
    if flag(spec.get("has_user_code")) and spec.get("user_code"):
        trees.append(spec["user_code"])
    for tree in trees:
        argv += ["--code", str(code_dir / tree)]
    for dest in spec.get("sync_dirs") or []:  # ddplab_sync_dirs: absolute, or relative to the lab folder
        argv += ["--sync-dir", f"{dest}={Path(str(spec['root'])) / str(dest)}"]
    return argv


def connect_targets(spec: dict) -> list[str]:
    """``NAME=ADDR:PORT`` for every other answering host whose listener started, and a worker's
    ``@master`` target (the master port, held by the master's listener) when the master answered."""
    up = spec.get("up") or []
    addrs, peers = spec.get("addrs") or {}, spec.get("peers") or {}
    targets = []
    for host in up:
        if host == spec["host"]:
            continue
        listen = ((last_json(peers.get(host)) or {}).get("results") or {}).get("listen") or {}
        if listen.get("ok") and listen.get("port"):
            targets.append(f"{host}={addrs.get(host, host)}:{int(listen['port'])}")
    if not is_master(spec) and spec["master"] in up:
        targets.append(f"{MASTER_TARGET}={spec['master_addr']}:{int(spec['master_port'])}")
    return targets


def smoke_plan(spec: dict) -> dict:
    """``{"run": argv}`` for the gloo smoke test, or ``{"skip": reason, "stop_warm": dir or None,
    "quit_master_listener": bool}``: what a skipped test still has to clean up after ``gather``."""
    results = last_json(spec.get("gather")) or {}
    warm = ((results.get("warm") or {}).get("dir")) or None
    probes = results.get("results") or {}
    gate = spec.get("gate") or {}
    if not flag(spec.get("gloo_smoke", True)):
        reason = "disabled (preflight_gloo_smoke: false)"
    elif not probes:
        reason = "the node's probes did not run"
    elif not flag(gate.get("smoke")):
        reason = str(gate.get("reason") or "the control host's gate said no")
    else:
        argv = ["gloo-smoke", "--rank", str(int(spec["rank"])), "--world", str(int(spec["world"])),
                "--master-addr", str(spec["master_addr"]), "--master-port", str(int(spec["master_port"])),
                "--timeout", str(spec.get("smoke_timeout", 5)), "--mb", str(spec.get("smoke_mb", 4))]
        dev = (probes.get("iface") or {}).get("dev")
        if dev:
            argv += ["--ifname", str(dev)]
        if warm:
            argv += ["--warm", warm]
        if is_master(spec):
            argv.append("--stop-listener")
        return {"run": argv}
    return {"skip": reason, "stop_warm": warm,
            "quit_master_listener": is_master(spec) and bool((probes.get("listen_master") or {}).get("ok"))}


def read_spec(text: str, needs: tuple[str, ...]) -> dict:
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise SpecError(f"the spec on stdin is not JSON ({e})") from None
    if not isinstance(spec, dict):
        raise SpecError("the spec on stdin is not a JSON object")
    missing = [k for k in needs if spec.get(k) in (None, "")]
    if missing:
        raise SpecError(f"the spec on stdin has no {', '.join(missing)}")
    return spec


def run(verb: str, text: str) -> int:
    """Run one step; returns the exit code (the nodeprobe command prints its own JSON line)."""
    from nodeprobe.__main__ import main as probe_main

    base = ("host", "master", "master_addr", "master_port", "world")
    if verb == "preflight-gather":
        return probe_main(gather_argv(read_spec(text, (*base, "root", "code_dir"))))
    if verb == "preflight-connect":
        spec = read_spec(text, base)
        targets = connect_targets(spec)
        if not targets:
            print(json.dumps({"probe": "connect", "ok": False, "targets": {},
                              "error": "no peer listener to connect to"}), flush=True)
            return 0
        timeout = str(spec.get("connect_timeout", 3))
        return probe_main(["connect", "--timeout", timeout, *(a for t in targets for a in ("--target", t))])
    spec = read_spec(text, (*base, "rank"))
    plan = smoke_plan(spec)
    if "run" in plan:
        return probe_main(plan["run"])
    if plan["stop_warm"]:
        with contextlib.suppress(OSError):  # the warm child may have left already (folder gone)
            (Path(plan["stop_warm"]) / "stop").touch()
    if plan["quit_master_listener"]:
        from nodeprobe import net

        net.connect(str(spec["master_addr"]), int(spec["master_port"]), 1.0, send_quit=True)
    print(json.dumps({"probe": "gloo-smoke", "skipped": True, "reason": plan["skip"]}), flush=True)
    return 0
