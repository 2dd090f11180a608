"""One process of the smoke run of the user's code (nodeprobe/code_smoke.py starts them; needs torch).

    python smoke_rank.py store FD                         # holds the run's TCPStore on a bound socket
    python smoke_rank.py rank REPORT STEPS -- ENTRY ARGS  # one rank: the user's entry point under watch
                                                          # (STEPS 0: to its end)

``rank`` runs the entry point (``-m pkg.mod`` or a script path) with runpy and ``sys.argv`` as torchrun
would give it, and records in REPORT (JSON, rewritten at each event): whether
``torch.distributed.init_process_group`` ran, its backend and world size; the collectives called, by kind
(the ``torch.distributed`` functions) and in all (the process groups' sequence numbers, which also count
DDP's reducer: its all-reduces go from C++ to the ProcessGroup, past any Python function; with torch 2.13
on gloo and a one-bucket model, building DDP moved the number by 3, the first backward by 1 and the
second by 3, when DDP rebuilds its buckets); how many DDP
models were built; after each optimizer step (torch's global step post-hook, which every
``torch.optim.Optimizer`` subclass runs) a sha256 of that optimizer's parameters (of those FSDP2
shards: their layout and this rank's part, see params_digest); and the first exception, with its frames
(and the types of its causes); the lines of the user's files that ran (``sys.settrace``, for frames of
files under the code folder only: a finding of the static check is settled only where its line ran); the
files ``torch.save`` wrote (a checkpoint: the smoke run resumes from it); and the hosts the code looked up
(``socket.getaddrinfo`` for a name that is not loopback: a download, which the nodes may have no route
to), each with the user's line. After STEPS optimizer steps the rank records ``done`` and sleeps: the
launcher, which sees every rank's report, ends the process group; with STEPS 0 the entry point runs to
its end.

``store`` hosts the rendezvous as torchrun's agent does (the ranks run with
TORCHELASTIC_USE_AGENT_STORE=True, so init_process_group connects as a client and no rank opens a store
of its own): on the socket the launcher bound to 127.0.0.1 (``master_listen_fd``), since a TCPStore
told a host still listens on every interface.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import runpy
import sys
import threading
import time
import traceback

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object",
               "all_to_all",
               "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather",
               "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
               "reduce_scatter_single", "scatter_object_list", "send", "recv", "isend", "irecv",
               "batch_isend_irecv")


class RankLayoutError(RuntimeError):
    """The code gave init_process_group a rank or world size other than torchrun's (RANK, WORLD_SIZE)."""


# what taking a node's variable for the run's does on several nodes
ALIAS_HARM = {"LOCAL_RANK": "the rank within a node, repeated on every node (two ranks claim one rank: "
                            "the group never forms)",
              "LOCAL_WORLD_SIZE": "the ranks of one node (each node waits for a group of its own size)",
              "GROUP_RANK": "the node's number, not the process's", "GROUP_WORLD_SIZE": "the number of nodes"}


def layout_mismatch(args: tuple, kwargs: dict) -> str | None:
    """What is wrong with the rank or world size passed to init_process_group(backend, init_method, timeout,
    world_size, rank, ...), measured against the environment torchrun set; None when they agree or are
    left to the environment."""
    env = os.environ
    for name, position, var in (("rank", 4, "RANK"), ("world_size", 3, "WORLD_SIZE")):
        given = kwargs.get(name, args[position] if len(args) > position else -1)
        try:
            given, want = int(given), int(env[var])
        except (TypeError, ValueError, KeyError):
            continue
        if given in (-1, want):
            continue
        alias = next((v for v in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")
                      if env.get(v) == str(given)), "")
        return (f"init_process_group({name}={given}), but torchrun made this process rank {env.get('RANK')} "
                f"of {env.get('WORLD_SIZE')} ({var}={want}), local rank {env.get('LOCAL_RANK')} on node "
                f"{env.get('GROUP_RANK')} of {env.get('GROUP_WORLD_SIZE')}"
                + (f"; {given} is its {alias}: {ALIAS_HARM[alias]}" if alias else ""))
    return None


DIGEST_STEPS = 16  # optimizer steps whose parameters are hashed (a whole run may make many; later ones count)
KEEP_EVENTS = 8  # checkpoints and look-ups kept per rank
LOOPBACK = ("localhost", "127.", "::1", "0.0.0.0", "ip6-localhost")


class Lines:
    """The lines of the user's files that ran (``sys.settrace``; frames of other files are not traced, so
    torch's own code runs at nearly full speed). Threads started after ``start`` are traced too; forked
    data-loader workers are not reported."""

    def __init__(self, code_root: str):
        self.root = code_root + os.sep
        self.ran: set[tuple[str, int]] = set()
        self.user: dict = {}  # code object -> its file relative to the code folder, or None
        # bound here: at interpreter exit, when module globals are gone, frames still call the tracer
        self.realpath, self.relpath, self.isabs = os.path.realpath, os.path.relpath, os.path.isabs

    def line(self, frame, event, _arg):
        if event == "line":
            self.ran.add((self.user.get(frame.f_code), frame.f_lineno))
        return self.line

    def call(self, frame, _event, _arg):
        code = frame.f_code
        rel = self.user.get(code, 0)
        if rel == 0:
            try:  # an exception here would be raised in the user's code
                path = self.realpath(code.co_filename) if self.isabs(code.co_filename) else ""
                rel = self.relpath(path, self.root) if path.startswith(self.root) else None
            except Exception:  # noqa: BLE001
                rel = None
            self.user[code] = rel
        return self.line if rel else None

    def start(self) -> None:
        threading.settrace(self.call)
        sys.settrace(self.call)

    def stop(self) -> None:
        sys.settrace(None)
        threading.settrace(None)

    def report(self) -> dict[str, list[int]]:
        by_file: dict[str, set[int]] = {}
        for rel, line in list(self.ran):
            by_file.setdefault(rel, set()).add(line)
        return {rel: sorted(lines) for rel, lines in sorted(by_file.items())}


class Recorder:
    """What one rank did, written to its report file after every event."""

    def __init__(self, path: str, steps_wanted: int, code_root: str):
        self.path, self.steps_wanted, self.code_root = path, steps_wanted, os.path.realpath(code_root)
        self.lock = threading.Lock()
        self.local = threading.local()
        self.lines = Lines(self.code_root)
        self.rec = {"rank": int(os.environ.get("RANK", "-1")), "pid": os.getpid(), "start": time.time(),
                    "init": None, "ddp": 0, "calls": {}, "ops": 0, "steps": [], "error": None, "exit": None,
                    "done": False, "saved": [], "fetches": [], "lines": {}}
        self.write()

    def user_place(self) -> dict | None:
        """The innermost frame of the user's code on the current stack."""
        for f in reversed(traceback.extract_stack()):
            path = os.path.realpath(f.filename) if os.path.isabs(f.filename) else ""
            if path.startswith(self.code_root + os.sep):
                return {"file": os.path.relpath(path, self.code_root), "line": f.lineno}
        return None

    def on_save(self, target) -> None:
        """torch.save wrote `target` (a path, or a file object with a name)."""
        name = getattr(target, "name", target)
        if not isinstance(name, (str, os.PathLike)):
            return
        path = os.path.abspath(os.fspath(name))
        with self.lock:
            if path not in [s["path"] for s in self.rec["saved"]] and len(self.rec["saved"]) < KEEP_EVENTS:
                self.rec["saved"].append({"path": path, "where": self.user_place()})
                self.write()

    def on_lookup(self, host) -> None:
        """The code looked up `host` (a download: gloo's and the store's own connections are not Python's)."""
        host = host.decode() if isinstance(host, bytes) else str(host or "")
        if not host or host.startswith(LOOPBACK) or host == os.environ.get("MASTER_ADDR"):
            return
        with self.lock:
            known = [f["host"] for f in self.rec["fetches"]]
            if host not in known and len(known) < KEEP_EVENTS:
                self.rec["fetches"].append({"host": host, "where": self.user_place(), "t": time.time()})
                self.write()

    def write(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.rec, f)
        os.replace(tmp, self.path)

    def group_ops(self) -> int:
        """Collectives issued on every process group so far (their sequence numbers)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return 0
        total = 0
        groups = list(getattr(dist.distributed_c10d._world, "pg_map", {}) or {}) or [dist.group.WORLD]
        for pg in groups:
            with contextlib.suppress(Exception):
                total += int(pg._get_sequence_number_for_group())
        return total

    def on_init(self) -> None:
        import torch.distributed as dist

        with self.lock:
            self.rec["init"] = {"backend": str(dist.get_backend()), "world": dist.get_world_size(),
                                "rank": dist.get_rank(), "t": time.time()}
            self.write()

    def on_call(self, kind: str) -> None:
        with self.lock:
            self.rec["calls"][kind] = self.rec["calls"].get(kind, 0) + 1
            self.write()

    def on_ops(self) -> None:
        """Keep the groups' count of collectives (before destroy_process_group forgets the groups)."""
        with self.lock:
            self.rec["ops"] = max(self.rec["ops"], self.group_ops())
            self.write()

    def on_ddp(self) -> None:
        with self.lock:
            self.rec["ddp"] += 1
            self.write()

    def on_compile(self, starts: bool) -> None:
        """torch.compile started or ended compiling (dynamo's callbacks: a new frame, or a backward compiled
        at its first run): the launcher does not count these seconds against its limit."""
        with self.lock:
            now = time.time()
            since = self.rec.pop("compiling_since", None)
            if since is not None:
                self.rec["compile_s"] = self.rec.get("compile_s", 0.0) + now - since
            if starts:
                self.rec["compiling_since"] = now
            self.write()

    def on_step(self, optimizer) -> None:
        digest, shards = params_digest(optimizer) if len(self.rec["steps"]) < DIGEST_STEPS else (None, None)
        with self.lock:
            self.rec["steps"].append({"optimizer": type(optimizer).__name__, "sha256": digest,
                                      "shards": shards, "ops": self.group_ops(),
                                      "calls": sum(self.rec["calls"].values()), "t": time.time()})
            done = 0 < self.steps_wanted <= len(self.rec["steps"])
            self.rec["done"] = done
            if done:
                self.rec["lines"] = self.lines.report()
            self.write()
        while done:  # the launcher ends the process group once every rank is here
            time.sleep(3600)

    def user_chain(self, exc: BaseException) -> list[dict]:
        """The frames of the exception's traceback in the user's code, outermost first, paths relative."""
        frames = [{"file": f.filename, "line": f.lineno, "func": f.name}
                  for f in traceback.extract_tb(exc.__traceback__)]
        user = [f for f in frames if os.path.isabs(f["file"])  # not "<frozen runpy>"
                and os.path.realpath(f["file"]).startswith(self.code_root + os.sep)]
        return [{"file": os.path.relpath(os.path.realpath(f["file"]), self.code_root), "line": f["line"],
                 "func": f["func"]} for f in user]

    def on_exit_0(self, exc: SystemExit) -> None:
        """Where the code called sys.exit(0) (an early exit without training names its line)."""
        chain = self.user_chain(exc)
        with self.lock:
            self.rec["exit_where"] = chain[-1] if chain else None
            self.write()

    def on_error(self, exc: BaseException) -> None:
        chain = self.user_chain(exc)
        where = chain[-1] if chain else None
        with self.lock:
            self.rec["error"] = {"type": type(exc).__name__, "message": str(exc).strip()[:600],
                                 "where": where, "chain": chain[-5:], "t": time.time(),
                                 "causes": cause_types(exc),
                                 "traceback": "".join(traceback.format_exception(exc))[-4000:]}
            self.write()

    def on_exit(self, code: int) -> None:
        with self.lock:
            self.rec["exit"] = code
            self.rec["lines"] = self.lines.report()
            self.write()


def cause_types(exc: BaseException) -> list[str]:
    """The type names of an exception and of those it was raised from or during (a download's error is
    often a library's own type raised from a socket error)."""
    names, seen = [], set()
    while exc is not None and id(exc) not in seen and len(names) < 8:
        seen.add(id(exc))
        names.append(type(exc).__name__)
        exc = exc.__cause__ or exc.__context__
    return names


def _update(h, tensor) -> None:
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    try:
        h.update(flat.numpy().tobytes())
    except RuntimeError:  # torch without numpy
        h.update(bytes(flat.tolist()))


def params_digest(optimizer) -> tuple[str, dict | None]:
    """What an optimizer's parameters are after its step, in its own order: sha256 of the bytes of every
    parameter this rank holds whole (a plain tensor, a replicated DTensor), which every rank must hold
    alike; and for DTensors sharded over a device mesh (FSDP2's fully_shard), their shards: how many values
    this rank holds of how many, the mesh's size and this rank's place in it, and a sha256 of the layout
    (each one's global shape, placements and the mesh's ranks), which every rank must share. None when no
    parameter is sharded."""
    import torch

    try:
        from torch.distributed.tensor import DTensor, Replicate
    except ImportError:  # a torch without DTensor: nothing is sharded
        DTensor, Replicate = (), None
    whole, layout = hashlib.sha256(), hashlib.sha256()
    shards = {"params": 0, "local_numel": 0, "global_numel": 0, "mesh_size": None, "coordinate": None}
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if not isinstance(p, DTensor):
                    _update(whole, p)
                elif all(isinstance(pl, Replicate) for pl in p.placements):
                    _update(whole, p.to_local())
                else:
                    mesh = p.device_mesh
                    layout.update(repr((tuple(p.shape), [str(pl) for pl in p.placements],
                                        mesh.mesh.tolist())).encode())
                    shards["params"] += 1
                    shards["local_numel"] += p.to_local().numel()
                    shards["global_numel"] += p.numel()
                    shards["mesh_size"], shards["coordinate"] = mesh.size(), mesh.get_coordinate()
    return whole.hexdigest(), (shards | {"layout": layout.hexdigest()}) if shards["params"] else None


def install(rec: Recorder) -> None:
    """Wrap init_process_group, the collectives and DDP's constructor; hook every optimizer step."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def counting(kind, fn):
        def wrapper(*args, **kwargs):
            outer = not getattr(rec.local, "inside", False)  # all_gather_object calls all_gather: count once
            if outer:
                rec.on_call(kind)
            rec.local.inside = True
            try:
                return fn(*args, **kwargs)
            finally:
                if outer:
                    rec.local.inside = False
        wrapper.__wrapped__ = fn
        return wrapper

    original_init, original_destroy = c10d.init_process_group, c10d.destroy_process_group

    def init_process_group(*args, **kwargs):
        wrong = layout_mismatch(args, kwargs)
        if wrong:  # raised here, the place is the user's call; let through, the group would hang or split
            raise RankLayoutError(wrong)
        out = original_init(*args, **kwargs)
        rec.on_init()
        return out

    def destroy_process_group(*args, **kwargs):
        rec.on_ops()
        return original_destroy(*args, **kwargs)

    for module in (dist, c10d):
        module.init_process_group = init_process_group
        module.destroy_process_group = destroy_process_group
        for kind in COLLECTIVES:
            fn = getattr(c10d, kind, None)
            if fn is not None:
                setattr(module, kind, counting(kind, fn))
    original_ddp_init = DistributedDataParallel.__init__

    def ddp_init(self, *args, **kwargs):
        original_ddp_init(self, *args, **kwargs)
        rec.on_ddp()

    DistributedDataParallel.__init__ = ddp_init
    watch_compiles(rec)
    register_optimizer_step_post_hook(lambda optimizer, _args, _kwargs: rec.on_step(optimizer))
    install_io(rec)


def install_io(rec: Recorder) -> None:
    """Record what torch.save writes and which hosts the code looks up."""
    import socket

    import torch

    original_save, original_lookup = torch.save, socket.getaddrinfo

    def save(obj, f, *args, **kwargs):
        out = original_save(obj, f, *args, **kwargs)
        rec.on_save(f)
        return out

    def getaddrinfo(host, *args, **kwargs):
        rec.on_lookup(host)
        return original_lookup(host, *args, **kwargs)

    save.__wrapped__, getaddrinfo.__wrapped__ = original_save, original_lookup
    torch.save = save
    socket.getaddrinfo = getaddrinfo


def watch_compiles(rec: Recorder) -> None:
    """Time torch.compile's compiles: each torch.compile call (the first imports dynamo and inductor, seconds
    of a cold start), then dynamo's start and end callbacks around each compile (importing dynamo here
    would cost code that never compiles)."""
    import torch

    original = torch.compile
    installed = []

    def compile_(*args, **kwargs):
        rec.on_compile(True)
        if not installed:
            from torch._dynamo.callback import callback_handler

            callback_handler.register_start_callback(lambda _args: rec.on_compile(True))
            callback_handler.register_end_callback(lambda _args: rec.on_compile(False))
            installed.append(True)
        try:
            return original(*args, **kwargs)
        finally:
            rec.on_compile(False)

    compile_.__wrapped__ = original
    torch.compile = compile_


def run_entry(entry: list[str], code_root: str) -> None:
    """Run ``-m mod ARGS`` or ``script ARGS`` as ``python`` would: argv, sys.path[0], __main__."""
    if entry[0] == "-m":
        module, args = entry[1], entry[2:]
        sys.argv = [module, *args]  # runpy puts the module's file in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script = entry[0] if os.path.isabs(entry[0]) else os.path.join(code_root, entry[0])
        sys.argv = [script, *entry[1:]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


def rank_main(argv: list[str]) -> int:
    report, steps = argv[0], int(argv[1])
    entry = argv[3:] if argv[2:3] == ["--"] else argv[2:]
    code_root = os.environ.get("DDPLAB_SMOKE_CODE", os.getcwd())
    rec = Recorder(report, steps, code_root)
    install(rec)
    rec.lines.start()
    code = 0
    try:
        run_entry(entry, code_root)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            rec.on_error(e)
        else:
            rec.on_exit_0(e)
    except BaseException as e:  # noqa: BLE001 - the user's exception is what this records
        rec.on_error(e)
        traceback.print_exc()
        code = 1
    rec.lines.stop()
    rec.on_ops()
    rec.on_exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def store_main(argv: list[str]) -> int:
    import datetime

    import torch.distributed as dist

    fd = int(argv[0])
    import socket

    sock = socket.socket(fileno=fd)
    host, port = sock.getsockname()[:2]
    store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, use_libuv=False,  # noqa: F841
                          timeout=datetime.timedelta(seconds=300), master_listen_fd=fd)
    print(f"store {host}:{port}", flush=True)
    while True:  # the launcher ends the process group
        time.sleep(3600)


if __name__ == "__main__":
    sys.path.pop(0)  # nodeprobe/ itself: the user's imports must not find its modules
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "store":
        sys.exit(store_main(sys.argv[2:]))
    if mode == "rank":
        sys.exit(rank_main(sys.argv[2:]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
