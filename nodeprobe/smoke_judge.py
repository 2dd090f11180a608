"""The verdict on one pass of the smoke run (nodeprobe/code_smoke.py): what the ranks recorded
(nodeprobe/smoke_rank.py) judged as one DDP run on CPU, or one sharded run (FSDP2).

It refuses a crash (the user's file:line; a download that found no route names the host and what to ship, a
missing module its package), no process group, a group that is not gloo of world size 2, no collective
before the first optimizer step (each rank trains alone), parameters that differ across the ranks after a
step (nodeprobe/smoke_shards.py), and an exit without any optimizer step.
"""

from __future__ import annotations

import re

from nodeprobe.smoke_launch import WORLD
from nodeprobe.smoke_shards import disagreement

MISSING_MODULE = re.compile(r"No module named '([^']+)'")
# exception types (or their causes) of a download that found no route, and the words of one in a message
NETWORK_ERRORS = {"URLError", "gaierror", "ConnectionError", "ConnectTimeout", "ConnectError",
                  "NewConnectionError", "NameResolutionError", "MaxRetryError", "ConnectTimeoutError",
                  "LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectionRefusedError",
                  "ConnectionResetError", "TimeoutError", "timeout"}
NETWORK_WORDS = re.compile(r"name resolution|Name or service not known|Network is unreachable|No route to "
                           r"host|nodename nor servname|getaddrinfo failed|couldn't connect to|Failed to "
                           r"resolve|Connection refused", re.I)
# import names whose package on PyPI is named otherwise (the fix for a missing module names the package)
PIP_NAMES = {"yaml": "PyYAML", "cv2": "opencv-python", "sklearn": "scikit-learn", "PIL": "Pillow",
             "skimage": "scikit-image", "bs4": "beautifulsoup4", "dateutil": "python-dateutil",
             "dotenv": "python-dotenv", "attr": "attrs", "jwt": "PyJWT", "git": "GitPython",
             "fitz": "PyMuPDF", "Crypto": "pycryptodome"}



def problem(kind: str, what: str, fix: str, rank: int | None = None, where: dict | None = None) -> dict:
    return {"kind": kind, "rank": rank, "what": what, "fix": fix,
            "where": f"{where['file']}:{where['line']}" if where else None}


def grouped(rank: dict) -> bool:
    """The rank made a gloo process group of the smoke run's world size."""
    init = rank.get("init") or {}
    return init.get("backend") == "gloo" and init.get("world") == WORLD


def compiling(run: dict) -> str:
    return f" (besides {run['compile_s']:g} s of torch.compile)" if run.get("compile_s") else ""


def download(rank: dict) -> dict | None:
    """The look-up a rank's error came from, when the error is a download that found no route: the last
    host the rank looked up before it (with the user's line), else the host named in the message."""
    err = rank["error"]
    typed = bool(NETWORK_ERRORS & set(err.get("causes") or [err["type"]]))
    worded = bool(NETWORK_WORDS.search(err["message"]))
    fetches = [f for f in rank.get("fetches") or [] if f.get("t", 0) <= err.get("t", float("inf"))]
    if not ((fetches and (typed or worded)) or (typed and worded)):
        return None
    if fetches:
        return fetches[-1]
    named = re.search(r"(?:https?://|host=')([A-Za-z0-9.-]+)", err["message"])
    return {"host": named.group(1) if named else "a host on the network", "where": None}


def no_route(rank: dict, fetch: dict) -> dict:
    err = rank["error"]
    return problem(
        "download", f"rank {rank['rank']} could not download from {fetch['host']} "
        f"({err['type']}: {err['message'][:200]})", f"the nodes may have no route to {fetch['host']} (this "
        "one had none): fetch it once on the control host and ship it with the code, in ddplab_code_include "
        "(files inside ddplab_code_dir that git ignores: data shards, a tokenizer) or ddplab_sync_dirs (a "
        "folder outside it), and have the code read that copy (for the Hugging Face hub: HF_HOME pointing "
        "at it and HF_HUB_OFFLINE=1 in ddplab_env)", rank["rank"], fetch.get("where") or err.get("where")) \
        | {"host": fetch["host"]}


def judge(run: dict, whole: bool = False, resume: bool = False) -> dict:
    """The verdict on what the ranks recorded: pass, fail (problems, the first is the cause) or
    inconclusive (the time ran out before a rank made an optimizer step, or with ``whole`` before the ranks
    ended). ``resume``: the second pass of a whole run, which may end without a step of its own."""
    ranks, wanted = run["ranks"], run["steps_wanted"]
    errors = sorted((r for r in ranks if r.get("error")), key=lambda r: r["error"].get("t", 0))
    if errors:
        first = errors[0]
        err = first["error"]
        fetch = download(first)
        if fetch:
            return {"verdict": "fail", "problems": [no_route(first, fetch)]}
        missing = MISSING_MODULE.search(err["message"]) if err["type"] == "ModuleNotFoundError" else None
        if missing:
            top = missing.group(1).split(".")[0]
            return {"verdict": "fail", "problems": [problem(
                "missing-module", f"rank {first['rank']} raised {err['type']}: {err['message']}",
                f"install the package that provides {top} ({PIP_NAMES.get(top, top)} on PyPI) on the nodes: "
                "list it in ddplab_pip_requirements (a requirements file in ddplab_code_dir) and run "
                "playbooks/prepare.yml again", first["rank"], err.get("where")) | {"module": top}]}
        if err["type"] == "RankLayoutError":
            return {"verdict": "fail", "problems": [problem(
                "rank-layout", f"rank {first['rank']}: {err['message']}", 'pass '
                'rank=int(os.environ["RANK"]) and world_size=int(os.environ["WORLD_SIZE"]), or leave both '
                "out (init_process_group reads them from torchrun's environment); keep LOCAL_RANK for "
                "choosing a device",
                first["rank"], err.get("where"))]}
        fix = ('create the process group on CPU too (init_process_group(backend="gloo")) before this call'
               if first.get("init") is None and "process group" in err["message"]
               else "make the code run on CPU under gloo at that place")
        return {"verdict": "fail", "problems": [problem(
            "crash", f"rank {first['rank']} raised {err['type']}: {err['message']}".rstrip(": "),
            fix, first["rank"], err.get("where"))]}
    killed = [r for r in ranks if r.get("returncode") not in (0, None, -9) and r.get("exit") is None]
    if killed:
        r = killed[0]
        return {"verdict": "fail", "problems": [problem(
            "crash", f"rank {r['rank']} ended with code {r['returncode']} without a Python exception"
            f" (last output: {' | '.join(r.get('log_tail', [])[-3:]) or 'none'})",
            "run the entry point by hand on the node to see why", r["rank"])]}
    problems = []
    stepped = [r for r in ranks if r.get("steps")]
    if not stepped:
        if run["timed_out"]:
            return {"verdict": "inconclusive", "problems": [], "note": (
                f"no rank made an optimizer step within {run['limit_s']:g} s{compiling(run)}; nothing was "
                "judged "
                "(raise ddplab_smoke_seconds to let it reach one)")}
        if resume:
            return {"verdict": "pass", "problems": [], "note": "the resumed ranks exited 0 without a step"}
        if all(grouped(r) and max(r.get("ops") or 0, sum((r.get("calls") or {}).values())) for r in ranks):
            return {"verdict": "pass", "problems": [], "note": (
                "the ranks exited 0 after collectives on a gloo group of 2 but made no torch.optim step: "
                "their parameters were not compared")}
        exited = next((r for r in ranks if r.get("exit_where")), None)  # sys.exit(0): its line
        return {"verdict": "fail", "problems": [problem(
            "no-training", "the ranks exited 0" + (" (sys.exit)" if exited else "") + " without an optimizer "
            "step (no torch.optim.Optimizer.step ran) and without training together", "check the arguments: "
            "on CPU the entry point must train (a device flag such as --device-type=cpu or --device=cpu, a "
            "step count > 0)", exited["rank"] if exited else None, exited["exit_where"] if exited else None)]}
    for r in ranks:
        init = r.get("init")
        if init is None:
            problems.append(problem(
                "no-group", f"rank {r['rank']} trained without torch.distributed.init_process_group: "
                "each rank trains alone", 'call init_process_group(backend="gloo") on CPU whenever '
                "RANK/WORLD_SIZE are set (torchrun sets them)", r["rank"]))
        elif init["backend"] != "gloo" or init["world"] != WORLD:
            problems.append(problem(
                "bad-group", f"rank {r['rank']}'s process group is {init['backend']} of world size "
                f"{init['world']} (expected gloo of {WORLD})", 'pass backend="gloo" on CPU and let '
                "init_process_group read the world size from the environment", r["rank"]))
    if not problems:
        for r in stepped:
            first = r["steps"][0]
            if max(first.get("ops", 0), first.get("calls", 0)) == 0:
                problems.append(problem(
                    "no-collectives", f"rank {r['rank']} made its first optimizer step without any "
                    "collective (no DDP all-reduce, no torch.distributed call): each rank trains alone",
                    "wrap the model in DistributedDataParallel on CPU too (device_ids=None), or all-reduce "
                    "the gradients before optimizer.step()", r["rank"]))
                break
    found = disagreement(stepped) if not problems and len(stepped) == WORLD else None
    if found:
        problems.append(problem(*found))
    if problems:
        return {"verdict": "fail", "problems": problems}
    if whole and run["timed_out"]:
        return {"verdict": "inconclusive", "problems": [], "note": (
            f"the ranks trained but did not reach the end of the run within {run['limit_s']:g} s"
            f"{compiling(run)} (raise "
            "ddplab_smoke_seconds or shorten ddplab_smoke_args)")}
    short = len(stepped) < WORLD or min(len(r["steps"]) for r in stepped) < wanted
    if short and run["timed_out"]:
        return {"verdict": "inconclusive", "problems": [], "note": (
            f"not every rank made {wanted} optimizer steps within {run['limit_s']:g} s{compiling(run)}")}
    return {"verdict": "pass", "problems": []}
