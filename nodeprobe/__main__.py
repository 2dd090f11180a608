"""``python -m nodeprobe <cmd>``: run one probe or node-side step on this node and print one JSON object."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _port(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nodeprobe", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="CMD")

    f = sub.add_parser("fingerprint", help="python/torch/cpu/memory/code/dtype/data facts of this node")
    f.add_argument("--data", help="shard folder (with manifest.json) to hash")
    f.add_argument("--root", help="the lab folder: free space on its file system")
    f.add_argument("--threads", type=_positive(int), help="threads the run is configured to use")
    f.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto", help="compute dtype asked")
    f.add_argument("--code", action="append", help="code folder to hash (repeatable: trainer, nodeprobe)")
    f.add_argument("--sync-dir", action="append", metavar="NAME=PATH",
                   help="a ddplab_sync_dirs folder to hash, NAME its configured dest (repeatable)")
    f.add_argument("--allow-bf16", action="store_true", help="as the trainer's flag: auto may pick bf16")
    f.add_argument("--force-dtype", action="store_true", help="as the trainer's flag (bf16 still reported)")
    f.add_argument("--depth", type=_positive(int), default=2, help="model depth (blocks)")
    f.add_argument("--n-embd", type=int, default=0, help="model width; 0 = 64*depth (as the trainer)")
    f.add_argument("--n-head", type=int, default=0, help="attention heads; 0 = n_embd/64")
    f.add_argument("--seq-len", type=_positive(int), default=128, help="tokens per sequence")
    f.add_argument("--batch-size", type=_positive(int), default=8, help="sequences per micro-batch")
    f.add_argument("--vocab", type=_positive(int), default=257, help="vocabulary size (byte-level: 257)")
    f.add_argument("--world", type=_positive(int), default=2, help="ranks in the run (DDP buckets if > 1)")

    li = sub.add_parser("listen", help="listen on a TCP port and answer connections for S seconds")
    li.add_argument("--port", type=_port, default=0, help="0 = ephemeral")
    li.add_argument("--seconds", type=_positive(float), default=20.0)
    li.add_argument("--bind", default="0.0.0.0")
    li.add_argument("--background", action="store_true",
                    help="print the port and return at once; a detached child keeps listening")

    c = sub.add_parser("connect", help="try TCP connects; report ok / refused / timeout / unreachable")
    c.add_argument("--host")
    c.add_argument("--port", type=_port)
    c.add_argument("--target", action="append", default=[], metavar="NAME=HOST:PORT",
                   help="several targets tried concurrently (repeatable)")
    c.add_argument("--timeout", type=_positive(float), default=3.0)
    c.add_argument("--quit", action="store_true", help="ask a nodeprobe listener to stop")

    ph = sub.add_parser("port-holder", help="which process listens on a TCP port")
    ph.add_argument("--port", type=_port, required=True)

    lp = sub.add_parser("lab-processes", help="leftover torchrun/trainer processes of this lab")
    lp.add_argument("--root", required=True, help="the lab folder (ddplab_root)")
    lp.add_argument("--shared", action="store_true",
                    help="this machine runs other labs too: count only processes tied to --root")

    sub.add_parser("resolve", help="what this node's hostname resolves to")

    i = sub.add_parser("iface", help="interface and source address toward the master")
    i.add_argument("--master", required=True, help="master address")

    ga = sub.add_parser("gather", help="every single-node probe of the preflight in one process")
    ga.add_argument("--master", required=True, help="master address (iface)")
    ga.add_argument("--root", required=True, help="the lab folder (lab-processes)")
    ga.add_argument("--shared", action="store_true", help="as lab-processes --shared")
    ga.add_argument("--master-port", type=_port,
                    help="this node is the master: port-holder, then listen on it when free")
    ga.add_argument("--expect", type=int, default=0,
                    help="connections the master-port listener answers before it quits")
    ga.add_argument("--listen-seconds", type=_positive(float), default=60.0,
                    help="lifetime of the background listeners")
    ga.add_argument("--data", help="shard folder (fingerprint)")
    ga.add_argument("--threads", type=_positive(int), help="threads the run is configured to use")
    ga.add_argument("--code", action="append", help="code folder to hash (repeatable)")
    ga.add_argument("--sync-dir", action="append", metavar="NAME=PATH",
                    help="a ddplab_sync_dirs folder to hash (fingerprint; repeatable)")
    ga.add_argument("--world", type=_positive(int), default=2, help="ranks in the run")
    ga.add_argument("--slurm", action="store_true",
                    help="ddplab_scheduler slurm: also probe munge, the daemons and this node in sinfo")
    ga.add_argument("--fingerprint-timeout", type=_positive(float), default=150.0,
                    help="seconds to wait for the warm child's fingerprint (torch import, hashing)")
    ga.add_argument("--trainer-args", default="[]",
                    help="the run's trainer arguments as a JSON list (dtype and model size are read)")

    g = sub.add_parser("gloo-smoke", help="real gloo collectives across the nodes, bounded by a watchdog")
    g.add_argument("--rank", type=int, required=True)
    g.add_argument("--world", type=_positive(int), required=True)
    g.add_argument("--master-addr", required=True)
    g.add_argument("--master-port", type=_port, required=True)
    g.add_argument("--timeout", type=_positive(float), default=5.0, help="process-group timeout, seconds")
    g.add_argument("--ifname", help="GLOO_SOCKET_IFNAME for this rank")
    g.add_argument("--mb", type=_positive(float), default=16.0, help="all-reduce size for the bandwidth")
    g.add_argument("--reps", type=_positive(int), default=3)
    g.add_argument("--model", default="", help="the run's model sizes as JSON (the fingerprint's): time one "
                   "step of it, to weigh the link's jitter and loss against")
    g.add_argument("--stop-listener", action="store_true",
                   help="rank 0: first stop the preflight's nodeprobe listener on the master port")
    g.add_argument("--warm", metavar="DIR",
                   help="hand the test to the warm child `gather` left in DIR (torch already imported)")

    for verb, what in (("preflight-gather", "gather"), ("preflight-connect", "connect"),
                       ("preflight-smoke", "gloo-smoke, or its clean-up when skipped"),
                       ("preflight-outside", "listener and connects on a node left out by --limit"),
                       ("preflight-outside-stop", "stop of preflight-outside's listeners")):
        sub.add_parser(verb, help=f"the preflight role's {what}, from a JSON spec on stdin "
                                  "(nodeprobe/preflight_node.py)")

    for verb, what in (("launch-facts", "what a launch needs to know"),
                       ("start-rank", "write the run's files and start the rank in tmux")):
        sub.add_parser(verb, help=f"the launch role's {what}, from a JSON spec on stdin "
                                  "(nodeprobe/start_rank.py)")

    sub.add_parser("ready", help="did this node pass launch.yml's checks with these inputs, and is it as "
                                 "it was then; or record that it did (nodeprobe/ready.py, a JSON spec)")

    sub.add_parser("code-smoke", help="run the user's entry point as 2 CPU ranks over loopback gloo and "
                                      "judge it, from a JSON spec on stdin (nodeprobe/code_smoke.py)")
    sub.add_parser("code-tune", help="run the configured entry point as N local ranks over loopback gloo "
                                     "for a bounded time, read its tokens/s (nodeprobe/code_tune.py)")

    cs = sub.add_parser("compile-seed", help="pack the master's torch.compile caches, this node's "
                        "fingerprint, or unpack a seed the control host checked (nodeprobe/compile_seed.py)")
    cs.add_argument("action", choices=["pack", "fingerprint", "unpack"])

    sub.add_parser("place-files", help="write small files from a JSON spec on stdin, each only when it "
                                       "differs (nodeprobe/place_files.py)")
    sub.add_parser("prune-placed", help="remove the files ddplab placed in a folder that left the plan, "
                                        "record the plan (JSON spec on stdin, nodeprobe/prune_placed.py)")

    r = sub.add_parser("route", help="interface, source address and hostname toward the master")
    r.add_argument("--master", required=True, help="master address")

    rs = sub.add_parser("run-status", help="state of one run on this node (roles/launch)")
    rs.add_argument("--run-dir", required=True)
    rs.add_argument("--socket", required=True, help="the lab's tmux socket")
    rs.add_argument("--session", required=True, help="tmux target of the run's session (=RUN)")
    rs.add_argument("--wait", type=float, default=0, metavar="S",
                    help="first wait up to S seconds for the rank's exit code (one poll of a wait)")
    rs.add_argument("--log-pattern", default="", metavar="REGEX",
                    help="ddplab_log_pattern: your code's lines in launch.log (\"\": nanoGPT's, nanochat's)")
    rs.add_argument("--total-steps", type=int, default=0, metavar="N",
                    help="the built-in trainer's steps (0: unknown, or read from your code's lines)")
    rs.add_argument("--job-state", default="", metavar="STATE",
                    help="a Slurm run: its job's state (squeue %%T; NONE when Slurm no longer knows it)")

    sub.add_parser("pack-run", add_help=False,
                   help="pack a run's files and its tmux scrollback into one archive (roles/logs; "
                        "nodeprobe/pack_run.py, whose own arguments follow)")

    vs = sub.add_parser("verify-shards", help="hash the shards a manifest names and compare (roles/dataset)")
    vs.add_argument("--dir", required=True, help="the node's shard folder")
    vs.add_argument("--manifest", default="-",
                    help="the manifest to verify against ('-': read it on stdin, as the control host's)")
    return p


def spec_verb(parser, cmd: str, run) -> int:
    """A verb fed a JSON spec on stdin: its result as one JSON line; a bad spec is a usage error; an OSError
    or RuntimeError is one line naming what failed (no traceback) and exit 1."""
    from nodeprobe.spec import SpecError

    try:
        result = run(sys.stdin.read())
    except SpecError as e:
        parser.error(str(e))
    except (OSError, RuntimeError) as e:
        print(json.dumps({"probe": cmd, "ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pack-run"]:  # its own parser (nodeprobe/pack_run.py)
        from nodeprobe import pack_run

        return pack_run.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd.startswith("preflight-"):
        from nodeprobe import preflight_node

        try:
            return preflight_node.run(args.cmd, sys.stdin.read())
        except preflight_node.SpecError as e:
            parser.error(str(e))
    if args.cmd in ("launch-facts", "start-rank"):
        from nodeprobe import start_rank

        return spec_verb(parser, args.cmd, lambda text: start_rank.run(args.cmd, text))
    if args.cmd == "ready":
        from nodeprobe import ready

        return spec_verb(parser, args.cmd, ready.run)
    if args.cmd in ("code-smoke", "code-tune"):
        from nodeprobe import code_smoke, code_tune

        return spec_verb(parser, args.cmd, (code_smoke if args.cmd == "code-smoke" else code_tune).run)
    if args.cmd == "compile-seed":
        from nodeprobe import compile_seed

        return spec_verb(parser, args.cmd, lambda text: compile_seed.run(args.action, text))
    if args.cmd == "gloo-smoke":
        if not 0 <= args.rank < args.world:
            parser.error(f"--rank {args.rank} is outside 0..{args.world - 1}")
        from nodeprobe import smoke

        if args.warm:
            smoke.run_warm(args)
        else:
            smoke.run(args)  # prints its own JSON (the watchdog may print it instead)
        return 0
    if args.cmd == "connect" and not args.target and (args.host is None or args.port is None):
        parser.error("connect needs --host and --port, or --target NAME=HOST:PORT")
    try:
        result = dispatch(args)
    except ValueError as e:
        parser.error(str(e))
    except Exception as e:  # noqa: BLE001 - the probe itself broke: one JSON line, no traceback
        result = {"probe": args.cmd, "ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(result), flush=True)
        return 1
    if result is not None:
        print(json.dumps(result), flush=True)
    return 0


def dispatch(args):
    if args.cmd == "fingerprint":
        from nodeprobe import fingerprint

        return fingerprint.run(args)
    if args.cmd == "gather":
        from nodeprobe import gather

        return gather.run(args)
    if args.cmd == "route":
        from nodeprobe import route

        return route.route(args.master)
    if args.cmd == "run-status":
        from nodeprobe import run_status

        return run_status.run_status(args.run_dir, args.socket, args.session, args.wait, args.log_pattern,
                                     args.total_steps, args.job_state)
    if args.cmd == "place-files":
        from nodeprobe import place_files

        return place_files.run(sys.stdin.read())
    if args.cmd == "prune-placed":
        from nodeprobe import prune_placed

        return prune_placed.run(sys.stdin.read())
    if args.cmd == "verify-shards":
        from nodeprobe import hashing

        text = sys.stdin.read() if args.manifest == "-" else Path(args.manifest).read_text()
        return hashing.verify_shards(args.dir, json.loads(text))
    from nodeprobe import net, procs

    if args.cmd == "listen":
        return net.listen(args.port, args.seconds, args.background, args.bind)
    if args.cmd == "connect":
        if args.target:
            return net.connect_many(args.target, args.timeout)
        return net.connect(args.host, args.port, args.timeout, send_quit=args.quit)
    if args.cmd == "port-holder":
        return procs.port_holder(args.port)
    if args.cmd == "lab-processes":
        return procs.lab_processes(args.root, shared=args.shared)
    if args.cmd == "resolve":
        return net.resolve()
    if args.cmd == "iface":
        return net.iface(args.master)
    raise ValueError(f"unknown command {args.cmd}")


if __name__ == "__main__":
    sys.exit(main())
