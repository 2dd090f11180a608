"""The preflight role's node steps, each driven by one JSON spec on stdin (no shell, no Jinja).

    python -m nodeprobe preflight-gather  < spec   # every single-node probe (`gather`)
    python -m nodeprobe preflight-connect < spec   # the master port and every peer's listener
    python -m nodeprobe preflight-smoke   < spec   # the gloo smoke test, or only clean up after gather
    python -m nodeprobe preflight-outside < spec   # a node left out by --limit: listen, connect to the play's
    python -m nodeprobe preflight-outside-stop < spec  # ... and stop that node's listeners afterwards

The spec is the role's ``preflight_spec`` (this node, the master, the hosts that answered SSH, lab
folders, the run's settings), plus ``addrs`` and ``peers`` (every answering host's address and its
``gather`` output) and ``outside`` (each answering left-out node's ``preflight-outside`` output) for
connect, and ``gather`` (this node's output) and ``gate`` (the control host's ``{"smoke": bool,
"reason": str}``) for smoke. Under ``--limit`` the nodes left out run only ``preflight-outside``
(delegated, once per node, before connect) and ``preflight-outside-stop`` (after it): their links
with the chosen nodes are checked in both directions, nothing else on them is looked at.

The decisions (master or not, which targets, smoke or skip) are the pure functions below; each step
then runs an ordinary nodeprobe command line (or the few probes of ``outside``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from nodeprobe.spec import SpecError, read_spec  # noqa: F401 (SpecError: callers catch it here)

MASTER_TARGET = "@master"


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
    if spec.get("scheduler") == "slurm":
        argv.append("--slurm")
    if is_master(spec):
        # the workers of this play and those left out by --limit (preflight-outside) knock on it
        peers = [h for h in spec.get("up") or [] if h != spec["host"]] + list(spec.get("left_out") or [])
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


def listener_port(output, name: str = "listen") -> int | None:
    """The port of the listener ``name`` that a gather/outside output says it started, or None."""
    found = ((last_json(output) or {}).get("results") or {}).get(name) or {}
    return int(found["port"]) if found.get("ok") and found.get("port") else None


def master_port_answers(output) -> bool:
    """A left-out master's outside output: something listens on the master port (ours, or a live run's)."""
    held = (((last_json(output) or {}).get("results") or {}).get("port_holder") or {}).get("free") is False
    return held or listener_port(output, "listen_master") is not None


def connect_targets(spec: dict) -> list[str]:
    """``NAME=ADDR:PORT`` for every other answering host whose listener started (this play's, then the
    left-out nodes' in ``outside``), and a worker's ``@master`` target (the master port) when the master
    answered: in this play, or left out with something listening on its master port."""
    up = spec.get("up") or []
    addrs, peers, outside = spec.get("addrs") or {}, spec.get("peers") or {}, spec.get("outside") or {}
    targets = []
    for host, output in [*((h, peers.get(h)) for h in up), *outside.items()]:
        port = listener_port(output)
        if host != spec["host"] and port:
            targets.append(f"{host}={addrs.get(host, host)}:{port}")
    master = spec["master"]
    if not is_master(spec) and (master in up or master_port_answers(outside.get(master))):
        targets.append(f"{MASTER_TARGET}={spec['master_addr']}:{int(spec['master_port'])}")
    return targets


def outside(spec: dict) -> dict:
    """A node left out by --limit: open a listener for the play's nodes (on the master also the master
    port, when free), then connect to their listeners. The listeners quit after one connect per node of
    the play, on ``preflight-outside-stop``, or after ``listen_seconds``."""
    from nodeprobe import net, procs

    seconds = float(spec.get("listen_seconds", 60))
    knocking = len([h for h in spec.get("up") or [] if h != spec["host"]])
    results: dict = {}
    if is_master(spec):
        port = int(spec["master_port"])
        results["port_holder"] = procs.port_holder(port)
        if results["port_holder"].get("free") and knocking:
            results["listen_master"] = net.listen(port, seconds, True, max_conns=knocking)
    results["listen"] = net.listen(0, seconds, True, max_conns=max(1, knocking))
    targets = connect_targets(spec)
    connect = (net.connect_many(targets, float(spec.get("connect_timeout", 3))) if targets else
               {"probe": "connect", "ok": False, "targets": {}, "error": "no listener of this play's nodes"})
    return {"probe": "outside", "results": results, "connect": connect}


def outside_stop(spec: dict) -> dict:
    """Ask the listeners ``preflight-outside`` started (its output is ``opened``) to quit, on loopback."""
    from nodeprobe import net

    stopped = {}
    for name in ("listen", "listen_master"):
        port = listener_port(spec.get("opened"), name)
        if port:
            stopped[name] = net.connect("127.0.0.1", port, 1.0, send_quit=True).get("ok", False)
    return {"probe": "outside-stop", "stopped": stopped}


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
        sizes = ((probes.get("fingerprint") or {}).get("memory") or {}).get("sizes")
        if sizes and not flag(spec.get("has_user_code")):  # the built-in trainer's model: its step is timed
            argv += ["--model", json.dumps(sizes)]
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


def run(verb: str, text: str) -> int:
    """Run one step; returns the exit code (the nodeprobe command prints its own JSON line)."""
    from nodeprobe.__main__ import main as probe_main

    base = ("host", "master", "master_addr", "master_port", "world")
    if verb in ("preflight-outside", "preflight-outside-stop"):
        step = outside if verb == "preflight-outside" else outside_stop
        spec = read_spec(text, base)
        try:
            result = step(spec)
        except Exception as e:  # noqa: BLE001 - one JSON line naming the error, no traceback
            result = {"probe": verb.removeprefix("preflight-"), "ok": False,
                      "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(result), flush=True)
        return 0
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
