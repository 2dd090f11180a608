"""`python -m ddplab export sbatch -i INV [-o FILE]`: the inventory's run as one self-contained sbatch script,
for a Slurm cluster ddplab does not manage (where only `sbatch` is allowed).

The script (ddplab/export_sbatch.sh.j2) checks in the job itself that its Python has the pinned torch and
that the shards match the control host's manifest (nodeprobe/hashing.py and the manifest travel inside
it), then runs one torchrun per node with `srun`: nodes = the inventory's node count, rank 0 on the job's
first node, GLOO_SOCKET_IFNAME = --iface or each node's interface toward the master. What torchrun runs
and with which of its own flags comes from ddplab/launch_command.py, as for the tmux path (roles/launch).
`bash FILE check-only` runs the two checks alone, without Slurm.

The script carries ddplab_env's values (secrets, maybe): it is written 0600 from its first byte, and run
as `sbatch FILE` or `bash FILE check-only`, neither of which needs it executable.

The cluster's shared file system holds the code and data at --root (ROOT/code, ROOT/data, runs in
ROOT/runs/<run>), the layout of a lab node's ddplab_root.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from ddplab.errors import DdplabError
from ddplab.inventory import _inventory_list
from ddplab.launch_command import launch_command
from ddplab.plan import new_run_id
from ddplab.settings import validate as settings_validate
from ddplab.settings.external import CPU_INDEX
from ddplab.settings.layout import MASTER, NODES
from trainer.launch_contract import is_run_id

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = Path(__file__).with_name("export_sbatch.sh.j2")
HASHING = REPO / "nodeprobe" / "hashing.py"
RANK_PYTHON = REPO / "roles" / "launch" / "templates" / "rank_python.sh.j2"  # torchrun's PYTHON_EXEC
# The first comment line of every exported script: a file without it is the user's and is never overwritten.
MARKER = "Written by `python -m ddplab export sbatch`"
TIME_LIMIT = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$")  # sbatch --time: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
# The script holds ddplab_env: readable by its owner only (sbatch and bash read it; nothing executes it).
SCRIPT_MODE = 0o600


def validate_input(inventory: str) -> dict:
    """`python -m ddplab validate`'s input for this inventory (the ddplab_* variables of every host)."""
    data = _inventory_list(inventory)
    hostvars = data.get("_meta", {}).get("hostvars", {})

    def members(group: str) -> list[str]:
        g = data.get(group, {})
        return sorted(set(g.get("hosts", [])).union(*(members(c) for c in g.get("children", []))))

    hosts = {h: {"vars": {k: v for k, v in hv.items() if k.startswith("ddplab_")},
                 "ansible_host": hv.get("ansible_host"), "ansible_connection": hv.get("ansible_connection")}
             for h, hv in hostvars.items()}
    return {"playbook_dir": str(REPO / "playbooks"), "hosts": hosts,
            "groups": {g: members(g) for g in (NODES, MASTER, "ddplab_workers")}}


def settings(inventory: str) -> tuple[dict, list[str]]:
    """The master's typed settings and the nodes, or DdplabError with the first problem's line."""
    inv = validate_input(inventory)
    nodes = inv["groups"][NODES]
    problems = [p for p in settings_validate.validate(inv, network=False) if p.level == "error"]
    if problems:
        raise DdplabError(problems[0].line(nodes).removeprefix("ddplab: error: "))
    values, _ = settings_validate.resolve(inv["hosts"][inv["groups"][MASTER][0]]["vars"], inv["playbook_dir"])
    if values["ddplab_elastic"]:
        raise DdplabError("ddplab_elastic (all): true; false for an exported job (a Slurm job has a "
                          "fixed node list); set ddplab_elastic: false in the inventory")
    return values, nodes


def lab_paths(v: dict, root: str, run: str) -> dict:
    """A node's lab layout (roles/lab_facts, run_id.yml) under root on the cluster."""
    byo = bool(v["ddplab_code_dir"])
    pythonpath = f"{root}/code" + (f"/{v['ddplab_code_subdir']}" if byo else "")
    run_dir = f"{root}/runs/{run}"
    return {"root": root, "code": f"{root}/code", "pythonpath": pythonpath, "data": f"{root}/data",
            "runs": f"{root}/runs", "run_dir": run_dir, "byo": byo, "compile_cache": f"{root}/compile-cache",
            "rank_cwd": pythonpath if byo and v["ddplab_workdir"] == "code" else run_dir}


def templar(variables: dict):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    return Templar(loader=DataLoader(), variables=variables)


def rank_python(run: str, python: str, env: dict) -> str:
    """The launch role's rank_python for this job: each local rank compiles into a folder of its own."""
    from ansible.template import trust_as_template

    variables = {"ansible_managed": MARKER, "ddplab_run": run, "launch_rank_python": python,
                 "ddplab_env": env}
    return templar(variables).template(trust_as_template(RANK_PYTHON.read_text()), escape_backslashes=False)


def heredoc_end(text: str, word: str) -> str:
    """A heredoc terminator that no line of text is."""
    lines = set(text.splitlines())
    while word in lines:
        word += "_"
    return word


def job_data(args, v: dict, nodes: list[str]) -> dict:
    run = args.run_id or v["ddplab_run_id"] or new_run_id()
    if not is_run_id(run):
        raise DdplabError(f"--run-id {run!r}: letters, digits, '.', '_' and '-' only; "
                          "pass e.g. --run-id run-1")
    root = (args.root or v["ddplab_root"]).rstrip("/")
    if not root.startswith("/"):
        raise DdplabError(f"--root {root!r}: not an absolute path on the cluster (ddplab_root's ~ is a lab "
                          "node's home); pass --root /path/on/the/cluster/shared/filesystem")
    if not TIME_LIMIT.match(args.time):
        raise DdplabError(f"--time {args.time!r}: not an sbatch time limit; "
                          "pass e.g. --time 01:30:00 or 2-00:00:00")
    if args.iface and not re.match(r"^[A-Za-z0-9_.:@-]{1,15}$", args.iface):
        raise DdplabError(f"--iface {args.iface!r}: not an interface name; pass e.g. --iface eth0, "
                          "or leave it out to use each node's interface toward the master")
    lab = lab_paths(v, root, run)
    command = launch_command(v, lab["pythonpath"], lab["data"], lab["run_dir"], run, v["ddplab_resume"])
    manifest = ""
    if v["ddplab_data_dir"]:
        manifest = json.dumps(json.loads((Path(v["ddplab_data_dir"]) / "manifest.json").read_text()),
                              separators=(",", ":"))
    hashing_py = HASHING.read_text()
    wrapper = rank_python(run, args.python, v["ddplab_env"])
    out_name = os.path.basename(args.output) if args.output != "-" else "job.sbatch"
    return {
        "marker": MARKER, "inventory": args.inventory, "run": run, "job_name": f"ddplab-{run}",
        "output_name": out_name, "nodes": len(nodes), "time_limit": args.time, "partition": args.partition,
        "python": args.python, "torch_pin": v["ddplab_torch_version"], "torch_index": CPU_INDEX,
        "root": root, "run_dir": lab["run_dir"], "data_dir": lab["data"], "rank_cwd": lab["rank_cwd"],
        "pythonpath": lab["pythonpath"], "pg_timeout": v["ddplab_pg_timeout"], "iface": args.iface,
        "threads": v["ddplab_threads"], "master_port": v["ddplab_master_port"],
        "nproc_per_node": v["ddplab_nproc_per_node"], "torchrun_flags": command["torchrun_flags"],
        "trainer_argv": command["trainer_argv"], "threads_flag": command["threads_flag"],
        "env": v["ddplab_env"], "manifest": manifest,
        "manifest_end": heredoc_end(manifest, "DDPLAB_MANIFEST"),
        "hashing_py": hashing_py, "hashing_end": heredoc_end(hashing_py, "DDPLAB_HASHING"),
        # as launch_compile_cache_own: ddplab_env may name the compile cache (or torchrun's Python) itself
        "compile_cache_own": not {"TORCHINDUCTOR_CACHE_DIR", "PYTHON_EXEC"} & set(v["ddplab_env"]),
        "compile_cache": lab["compile_cache"], "rank_python": wrapper,
        "rank_python_end": heredoc_end(wrapper, "DDPLAB_RANK_PYTHON"),
        "control_data_dir": v["ddplab_data_dir"],
    }


def render(data: dict) -> str:
    from ansible.template import trust_as_template

    return templar(data).template(trust_as_template(TEMPLATE.read_text()), escape_backslashes=False)


def write(text: str, output: str) -> None:
    if output == "-":
        sys.stdout.write(text)
        return
    path = Path(output)
    if path.is_dir():
        raise DdplabError(f"-o {output}: is a folder; pass a file name such as "
                          f"-o {output.rstrip('/')}/job.sbatch")
    if path.exists():
        with open(path, errors="replace") as f:
            head = f.read(4096)
        if MARKER not in head:
            raise DdplabError(f"-o {output}: exists and was not written by ddplab export; "
                              "choose another file name or remove it yourself")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SCRIPT_MODE)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, SCRIPT_MODE)  # the umask only takes bits away; this says what the file is
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DdplabError(f"-o {output}: cannot write it ({e.strerror}); pass a writable path") from e


def run(args) -> int:
    v, nodes = settings(args.inventory)
    text = render(job_data(args, v, nodes))
    write(text, args.output)
    if args.output == "-" and v["ddplab_env"]:
        print("ddplab: note: the script holds the values of ddplab_env; keep the file you save it in private "
              "(chmod 600)", file=sys.stderr)
    if args.output != "-":
        print(f"ddplab: wrote {args.output}: {len(nodes)} nodes; check it with "
              f"`bash {args.output} check-only` on the cluster, submit it with `sbatch {args.output}`",
              file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="the inventory's run for a Slurm cluster ddplab does not manage",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="kind", required=True)
    s = kinds.add_parser("sbatch", help="a self-contained sbatch script", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("-i", "--inventory", required=True,
                   help="the lab's inventory (its node count and settings)")
    s.add_argument("-o", "--output", default="-", help="the script's file (default: standard output)")
    s.add_argument("--root", default="", help="the lab folder on the cluster's shared file system, holding "
                   "code/ and data/ (default: the inventory's ddplab_root when absolute)")
    s.add_argument("--python", default="python3", help="the job's Python, with torch==ddplab_torch_version "
                   "(default: python3)")
    s.add_argument("--time", default="01:00:00", help="sbatch --time (default: 01:00:00)")
    s.add_argument("--partition", default="", help="sbatch --partition (default: the cluster's default)")
    s.add_argument("--iface", default="", help="GLOO_SOCKET_IFNAME on every node (default: each node's "
                   "interface with the route to the master)")
    s.add_argument("--run-id", default="", help="the run's id (default: ddplab_run_id, else a new one)")
    s.set_defaults(func=run)
