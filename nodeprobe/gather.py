"""``gather``: every single-node probe of the preflight in one process (one Ansible task per node).

Importing torch is the slow part of a probe (seconds on a busy node), so it happens once per node:
``gather`` forks a detached *warm* child that imports torch, writes the fingerprint (torch, CPU,
memory via the trainer's estimate, code and shard hashes) to its folder and then waits there for
the gloo smoke test's arguments (``gloo-smoke --warm DIR`` hands them over and collects the
result), for ``stop``, or for ``--listen-seconds`` to pass. Meanwhile the parent runs the quick
probes. Order matters on the master: ``port-holder`` is read before anything listens on the master
port; only when the port is free does a background listener take it (it quits after ``--expect``
connections, the workers' connects, or on ``quit``, or after ``--listen-seconds``). Every node also
opens an ephemeral background listener for its peers. A probe that breaks becomes ``{"ok": false,
"error": ...}`` in its slot; the others still run.

Prints ``{"probe": "gather", "host": ..., "warm": {"dir": ..., "pid": ...}, "results":
{"port_holder": ..., "listen_master": ..., "listen": ..., "resolve": ..., "iface": ...,
"lab_processes": ..., "firewall": ..., "fingerprint": ..., "slurm": ... (with --slurm)}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from nodeprobe.net import detach


def trainer_settings(argv: list[str]) -> argparse.Namespace:
    """The trainer flags that change dtype and memory, read leniently from the run's trainer args."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=0)
    p.add_argument("--n-head", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--allow-bf16", action="store_true")
    p.add_argument("--force-dtype", action="store_true")
    known, _ = p.parse_known_args([str(a) for a in argv])
    if known.dtype not in ("auto", "fp32", "bf16"):
        known.dtype = "auto"  # the trainer itself rejects it with its own message
    return known


def _safe(fn) -> dict:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - one broken probe must not hide the others
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def warm_child(folder: Path, fp_args: argparse.Namespace, lifetime: float) -> None:
    """The warm child's life: fingerprint (imports torch), then wait for go.json / stop / the end."""
    from nodeprobe import fingerprint

    deadline = time.monotonic() + lifetime
    try:
        _write_json(folder / "pid", {"pid": os.getpid()})
        _write_json(folder / "fingerprint.json", _safe(lambda: fingerprint.run(fp_args)))
        while time.monotonic() < deadline and not (folder / "stop").exists():
            go = folder / "go.json"
            if go.exists():
                from nodeprobe import smoke

                smoke_args = argparse.Namespace(**json.loads(go.read_text()))
                out = os.open(folder / "result.part", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(out, 1)
                smoke.run(smoke_args)  # prints one JSON line (to result.part); may os._exit itself
                return
            time.sleep(0.05)
        shutil.rmtree(folder, ignore_errors=True)  # nobody came: leave nothing behind
    finally:
        os._exit(0)


def wait_fingerprint(folder: Path, timeout: float) -> dict:
    path = folder / "fingerprint.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass  # being replaced: read again
        time.sleep(0.05)
    return {"ok": False, "error": f"the fingerprint (torch import, hashing) took over {timeout:.0f} s"}


def run(args) -> dict:
    from nodeprobe import net, procs, route

    start = time.monotonic()
    try:
        extra = json.loads(args.trainer_args or "[]")
        if not isinstance(extra, list):
            raise ValueError("not a list")
    except ValueError as e:
        raise ValueError(f"--trainer-args must be a JSON list of strings ({e})") from None
    t = trainer_settings(extra)
    fp_args = argparse.Namespace(
        data=args.data, root=args.root, threads=args.threads, dtype=t.dtype, code=args.code,
        sync_dir=args.sync_dir, allow_bf16=t.allow_bf16,
        force_dtype=t.force_dtype, depth=max(1, t.depth), n_embd=t.n_embd, n_head=t.n_head,
        seq_len=max(2, t.seq_len), batch_size=max(1, t.batch_size), vocab=257, world=args.world)
    folder = Path(tempfile.mkdtemp(prefix="ddplab-preflight-"))
    if detach():
        warm_child(folder, fp_args, args.listen_seconds)
    results: dict = {}
    if args.master_port is not None:
        results["port_holder"] = _safe(lambda: procs.port_holder(args.master_port))
        if results["port_holder"].get("free") and args.expect > 0:
            results["listen_master"] = _safe(lambda: net.listen(
                args.master_port, args.listen_seconds, True, max_conns=args.expect))
    results["listen"] = _safe(lambda: net.listen(0, args.listen_seconds, True))
    results["resolve"] = _safe(net.resolve)
    results["iface"] = _safe(lambda: net.iface(args.master))
    # what roles/gloo_network reads in the same command (no second probe before the launch)
    results["route"] = _safe(lambda: route.route(args.master))
    results["lab_processes"] = _safe(lambda: procs.lab_processes(args.root, shared=args.shared))
    results["firewall"] = _safe(net.firewall)
    if args.slurm:
        from nodeprobe import slurm_node

        results["slurm"] = _safe(slurm_node.probe)
    results["fingerprint"] = wait_fingerprint(folder, args.fingerprint_timeout)
    try:
        pid = json.loads((folder / "pid").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        pid = None
    return {"probe": "gather", "host": socket.gethostname(), "elapsed_s": round(time.monotonic() - start, 3),
            "warm": {"dir": str(folder), "pid": pid}, "results": results}
