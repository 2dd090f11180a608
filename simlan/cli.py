"""`python -m simlan ...`: the command line over simlan.cluster. Errors are one line on stderr
(`simlan: error: ...`) with exit 2 (bad input, missing requirement) or 1 (failure), no traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys

from simlan import network
from simlan.errors import SimlanError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, like every other simlan error
        self.exit(2, f"simlan: error: {message} (see `python -m {self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="simlan", description="A simulated LAN of namespaced hosts with real sshd (needs root).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    u = sub.add_parser("up", help="create hosts node0..N-1 and write inventory/simlan/")
    u.add_argument("--nodes", type=int, default=2, help="number of hosts (default 2)")
    u.add_argument("--rate", default=None,
                   help="shape each host's eth0 with tc tbf at this rate (tc syntax: 1gbit, 100mbit); "
                        "default unshaped")
    u.add_argument("--cpus", choices=["auto", "none"], default="none",
                   help="auto: pin host i (its PID 1 and every process under it) to CPU i mod nproc")
    u.add_argument("--syn-retries", type=int, default=3,
                   help="net.ipv4.tcp_syn_retries inside each host (kernel default 6, ~127 s before a "
                        "connect to a silent peer fails; 3 fails in ~15 s) (default 3)")
    u.add_argument("--inventory", default=None, help="inventory folder to write (default inventory/simlan)")
    u.add_argument("--python", default=None,
                   help="ansible_python_interpreter for the hosts (default: the venv Python running simlan)")
    u.add_argument("--keep", action="append", default=[],
                   help="another path under root's home to keep visible in the hosts' private home")
    u.add_argument("--stock", action="store_true",
                   help="hosts that look like a fresh Debian 12 install: own root filesystem (built once "
                        "with debootstrap, cached in /var/cache/ddplab-simlan), login user `lab` with a "
                        "sudo password, package registries reachable through NAT (see simlan/README.md)")
    u.add_argument("--release", action="append", default=[], metavar="HOST=RELEASE",
                   help="with --stock: HOST is a fresh Debian 13 (trixie: Python 3.13, OpenSSH 10) instead "
                        "of 12 (bookworm), e.g. node1=trixie; repeatable")
    u.add_argument("--cpu-quota", action="append", default=[], metavar="HOST=PERCENT",
                   help="run HOST at PERCENT of one core (cgroup CPU bandwidth), e.g. node1=50; repeatable")
    u.add_argument("--mem-limit", action="append", default=[], metavar="HOST=SIZE",
                   help="give HOST SIZE of memory (cgroup memory limit; K, M, G), e.g. node1=1536M: a "
                        "process that would take it over is OOM-killed; repeatable")
    u.add_argument("--force", action="store_true", help="recreate the cluster if one is already up")

    e = sub.add_parser("exec", help="run a command inside a host: exec NODE -- CMD ...")
    e.add_argument("node")
    e.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (after --)")

    sub.add_parser("status", help="table of hosts; exit 1 if a host's PID 1 or sshd is gone")
    sub.add_parser("down", help="remove everything simlan made (safe to run twice)")

    k = sub.add_parser("kill-host", help="simulate a host dying: cable pulled, every process SIGKILLed")
    k.add_argument("node")
    k.add_argument("--keep-link", action="store_true",
                   help="leave the cable in: peers get connection resets instead of silence")

    r = sub.add_parser("revive-host",
                       help="bring a killed host back: new PID 1 and sshd, same files and address")
    r.add_argument("node")

    f = sub.add_parser("freeze", help="a lid that closes: stop every process of a host where it is (cgroup "
                                      "freezer); `thaw` lets them run on")
    f.add_argument("node")
    t = sub.add_parser("thaw", help="a lid that opens: the frozen host's processes run on")
    t.add_argument("node")

    w = sub.add_parser("link", help="a Wi-Fi-like link: delay, jitter and loss on a host's outgoing packets")
    w.add_argument("node")
    w.add_argument("--delay", default="0ms", help="added to every packet, e.g. 3ms")
    w.add_argument("--jitter", default="0ms", help="a further random 0..2x this, e.g. 8ms (mean: this)")
    w.add_argument("--loss", default="0%", help="packets dropped, e.g. 0.5%%")
    w.add_argument("--clear", action="store_true", help="a plain link again")

    s = sub.add_parser("sshd", help="stop, start or restart a host's sshd")
    s.add_argument("node")
    s.add_argument("action", choices=["stop", "start", "restart"])
    s.add_argument("--cut", action="store_true", help="also kill the host's open SSH sessions")
    return p


def _table(rows: list[dict]) -> str:
    cols = [("host", "HOST"), ("address", "ADDRESS"), ("pid1", "PID 1"), ("sshd", "SSHD"),
            ("rate", "RATE"), ("cpu", "CPU"), ("quota", "QUOTA")]
    cells = [[h for _, h in cols]] + [[str(r[k] if r[k] is not None else "dead") for k, _ in cols]
                                      for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
    return "\n".join(lines)


def _require_cluster(cluster_mod):
    c = cluster_mod.load()
    if c is None:
        raise SimlanError("no simlan cluster is up; start one with `python -m simlan up --nodes 2`", code=2)
    return c


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from simlan import system

        problem = system.root_problem()
        if problem:
            raise SimlanError(problem, code=2)
        from simlan import cluster as cluster_mod

        if args.command == "up":
            c = cluster_mod.up(args.nodes, rate=args.rate, cpus=args.cpus, syn_retries=args.syn_retries,
                               force=args.force, inventory_dir=args.inventory, python=args.python,
                               keep=tuple(args.keep), stock=args.stock, cpu_quota=tuple(args.cpu_quota),
                               release=tuple(args.release),
                               mem_limit=tuple(args.mem_limit))
            print(f"simlan: {'already up' if c.reused else 'up'}: {len(c.hosts)} "
                  f"{'stock ' if c.stock else ''}host(s) on "
                  f"{network.BRIDGE} {network.GATEWAY}/{network.PREFIX_LEN}; inventory {c.inventory_dir}")
            if c.egress:
                allowed = c.egress["allowed"]
                print(f"simlan: package traffic allowed (NAT): tcp 80,443 to {', '.join(allowed['web'])} "
                      f"({', '.join(allowed['registries'])}); dns to {', '.join(allowed['dns'])}")
            print(_table(c.status()))
            return 0
        if args.command == "status":
            c = _require_cluster(cluster_mod)
            rows = c.status()
            print(_table(rows))
            bad = [r["host"] for r in rows if not r["ok"]]
            if bad:
                print(f"simlan: not healthy: {', '.join(bad)}", file=sys.stderr)
                return 1
            return 0
        if args.command == "down":
            removed = cluster_mod.down()
            print("simlan: down: removed the cluster" if removed else "simlan: down: nothing to remove")
            return 0
        if args.command == "exec":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            if not cmd:
                raise SimlanError("exec needs a command: python -m simlan exec NODE -- CMD ...", code=2)
            c = _require_cluster(cluster_mod)
            argv_ = c.nsenter_argv(args.node) + cmd
            try:
                proc = subprocess.run(argv_, env=c.host_env(args.node), preexec_fn=c.pin(args.node))
            except KeyboardInterrupt:
                return 130
            return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        if args.command == "kill-host":
            c = _require_cluster(cluster_mod)
            c.kill_host(args.node, keep_link=args.keep_link)
            print(f"simlan: {args.node}: killed (every process SIGKILLed"
                  f"{'' if args.keep_link else ', cable pulled'})")
            return 0
        if args.command == "revive-host":
            c = _require_cluster(cluster_mod)
            c.revive_host(args.node)
            print(f"simlan: {args.node}: up again (new PID 1 and sshd, cable in)")
            return 0
        if args.command in ("freeze", "thaw"):
            c = _require_cluster(cluster_mod)
            (c.freeze_host if args.command == "freeze" else c.thaw_host)(args.node)
            print(f"simlan: {args.node}: {'frozen' if args.command == 'freeze' else 'thawed'}")
            return 0
        if args.command == "link":
            c = _require_cluster(cluster_mod)
            if args.clear:
                c.set_link(args.node)
                print(f"simlan: {args.node}: plain link")
            else:
                c.set_link(args.node, args.delay, args.jitter, args.loss)
                print(f"simlan: {args.node}: outgoing delay {args.delay}, jitter {args.jitter}, "
                      f"loss {args.loss}")
            return 0
        if args.command == "sshd":
            c = _require_cluster(cluster_mod)
            print(f"simlan: {args.node}: {c.sshd(args.node, args.action, cut=args.cut)}")
            return 0
    except SimlanError as exc:
        print(f"simlan: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("simlan: interrupted", file=sys.stderr)
        return 130
    return 2
