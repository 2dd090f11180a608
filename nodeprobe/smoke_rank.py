"""One process of the smoke run of the user's code (nodeprobe/code_smoke.py starts them; needs torch).

    python smoke_rank.py store FD                         # holds the run's TCPStore on a bound socket
    python smoke_rank.py rank REPORT STEPS -- ENTRY ARGS  # one rank: the user's entry point under watch
                                                          # (STEPS 0: to its end)

``rank`` runs the entry point (``-m pkg.mod`` or a script path) with runpy and ``sys.argv`` as torchrun
would give it, with torch's functions wrapped (nodeprobe/smoke_hooks.py) to record in REPORT what the rank
did (nodeprobe/smoke_record.py). After STEPS optimizer steps the rank records ``done`` and sleeps: the
launcher (nodeprobe/smoke_launch.py), which sees every rank's report, ends the process group; with STEPS 0
the entry point runs to its end.

``store`` hosts the rendezvous as torchrun's agent does (the ranks run with
TORCHELASTIC_USE_AGENT_STORE=True, so init_process_group connects as a client and no rank opens a store
of its own): on the socket the launcher bound to 127.0.0.1 (``master_listen_fd``), since a TCPStore
told a host still listens on every interface.

The modules it takes from nodeprobe/ are imported as siblings (nodeprobe/ is ``sys.path[0]`` of a script),
then forgotten with that path entry before the user's code runs: its imports find none of nodeprobe's.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
import traceback

from smoke_hooks import install  # siblings: see the docstring
from smoke_record import Recorder


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
    own = sys.path.pop(0)  # nodeprobe/ itself: the user's imports must not find its modules
    for name in [n for n, m in sys.modules.items()
                 if n != "__main__" and os.path.dirname(getattr(m, "__file__", None) or "") == own]:
        del sys.modules[name]  # the siblings above (their functions keep what they need)
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "store":
        sys.exit(store_main(sys.argv[2:]))
    if mode == "rank":
        sys.exit(rank_main(sys.argv[2:]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
