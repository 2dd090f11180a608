"""What one rank of the smoke run did, kept in its report file (JSON, rewritten at each event), which the
launcher (nodeprobe/smoke_launch.py) watches and the judge (nodeprobe/smoke_judge.py) reads.

The record holds: whether ``torch.distributed.init_process_group`` ran, its backend and world size; the
collectives called, by kind (the ``torch.distributed`` functions) and in all (the process groups' sequence
numbers, which also count DDP's reducer: its all-reduces go from C++ to the ProcessGroup, past any Python
function; with torch 2.13 on gloo and a one-bucket model, building DDP moved the number by 3, the first
backward by 1 and the second by 3, when DDP rebuilds its buckets); how many DDP models were built; after
each optimizer step a sha256 of that optimizer's parameters (of those FSDP2 shards: their layout and this
rank's part, nodeprobe/smoke_shards.py); the first exception, with its frames (and the types of its
causes); the lines of the user's files that ran (nodeprobe/smoke_lines.py); the files ``torch.save`` wrote
(a checkpoint: the smoke run resumes from it); and the hosts the code looked up (``socket.getaddrinfo`` for
a name that is not loopback: a download, which the nodes may have no route to), each with the user's line.
nodeprobe/smoke_hooks.py calls its ``on_*`` methods.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import traceback

from smoke_lines import Lines  # siblings, found while nodeprobe/ is sys.path[0] (nodeprobe/smoke_rank.py)
from smoke_shards import params_digest

DIGEST_STEPS = 16  # optimizer steps whose parameters are hashed (a whole run may make many; later ones count)
KEEP_EVENTS = 8  # checkpoints and look-ups kept per rank
LOOPBACK = ("localhost", "127.", "::1", "0.0.0.0", "ip6-localhost")


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
