"""The one typed specification of every `ddplab_*` name: type, default, range, choices, one-line doc.

Everything else is derived from this list: the role defaults (roles/ddplab/defaults/main.yml), the
commented example inventory (inventory/example/group_vars/all/{ddplab,code}.yml: the settings reference)
and the checks of `python -m ddplab validate`. (No role argument specs: Ansible loads and copies them at
each of a command's ~30 role loads, 0.3-0.4 CPU-s per command, to check less than validate does.)
Add a setting here, then run `python -m ddplab settings --write`.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeprobe import log_metrics
from trainer.launch_contract import MASTER_PORT, PG_TIMEOUT_S, RUN_ID, RUN_ID_DOC

# Sections: where a setting is documented. "run" and "code" go to the example group_vars files;
# "host" settings are per inventory host (documented in inventory/example/hosts.yml) and have no default.
RUN, CODE, HOST = "run", "code", "host"


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # int, bool, str, list (of strings, or of mappings: `elements`), dict (of strings)
    default: object  # a value, or a Jinja string (see `jinja`); None: no default (host settings)
    doc: str  # one line (the generated files wrap it)
    section: str = RUN
    min: int | None = None
    max: int | None = None
    choices: tuple = ()
    pattern: str | None = None  # full-match regex for str values ("" is always allowed unless `required`)
    pattern_doc: str = ""  # what the pattern allows, in words
    per_host: bool = False  # may differ between hosts (else one value for the whole run)
    example: object = None  # shown in the example inventory instead of the default
    required: bool = False  # host settings every node must have
    elements: str = "str"  # a list's items: str, or dict (each {src, dest}: ddplab_sync_dirs)

    @property
    def jinja(self) -> bool:
        return isinstance(self.default, str) and "{{" in self.default

    def allowed(self) -> str:
        """What values are allowed, in words (the middle part of a message)."""
        if self.kind == "int":
            if self.min is not None and self.max is not None:
                return f"an integer in {self.min}..{self.max}"
            if self.min is not None:
                return f"an integer >= {self.min}"
            return "an integer"
        if self.kind == "bool":
            return "true or false (also yes/no, on/off, 1/0)"
        if self.kind == "list" and self.elements == "dict":
            return ("a list of {src: control-host folder, dest: node folder}, e.g. "
                    "[{\"src\": \"/data/owt\", \"dest\": \"data/owt\"}]")
        if self.kind == "list":
            return "a list of strings, e.g. [\"a\", \"b\"]"
        if self.kind == "dict":
            return "a mapping of names to strings, e.g. {NAME: value}"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        return self.pattern_doc or "a string"


SETTINGS: tuple[Setting, ...] = (
    # --- the nodes ---------------------------------------------------------------------------------
    Setting("ddplab_root", "str", "~/ddplab",
            "Lab folder on every node (code/, data/, venv/, runs/<run_id>/, tmux.sock); `~` is the SSH "
            "user's home. A folder of ddplab's own: not ~ or / itself, and new, empty or made by ddplab "
            "(an existing folder with other files is refused on the node, nothing changed).",
            pattern=r"(~/+|/+)[^/].*", pattern_doc="a folder of its own: a path under ~/ or / (not ~ or /)",
            per_host=True),
    Setting("ddplab_master_port", "int", MASTER_PORT,
            "Rank 0's TCP port for torchrun's rendezvous store; prepare.yml ends whatever listens on it "
            "on the master.", min=1, max=65535),
    Setting("ddplab_torch_version", "str", "2.13.0",
            "Exact torch version on every node (the CPU wheel); must exist in the configured wheel folder "
            "or index. A node whose Python has it (with numpy and pyarrow) is reused; otherwise a venv is "
            "made in <ddplab_root>/venv.",
            pattern=r"\d+(\.\d+){1,2}((a|b|rc)\d+)?(\.post\d+)?(\+[a-z0-9.]+)?",
            pattern_doc="a version such as 2.13.0"),
    Setting("ddplab_python", "str", "",
            "Python to try first on each node (\"\" = the Ansible interpreter, then python3).",
            per_host=True, example="/opt/py/bin/python3"),
    Setting("ddplab_pip_index_url", "str", "",
            "pip index for torch when a node needs a new venv, e.g. a local mirror (\"\" = pip's default "
            "index).",
            pattern=r"(https?|file)://\S+", pattern_doc="an http(s):// or file:// URL", per_host=True),
    Setting("ddplab_pip_find_links", "str", "",
            "A folder of wheels (or a URL) pip also looks in for torch (\"\" = none).", per_host=True),
    Setting("ddplab_pip_index_fallback", "bool", False,
            "Let a node install from a package index what the wheelhouse does not hold: torch without a "
            "wheelhouse, ddplab_pip_requirements changed since or never filled by `make wheelhouse` (a "
            "warning names the file). false: prepare stops with that message; a node installs only the "
            "manifest's wheels, by their sha256."),
    # --- the run -------------------------------------------------------------------------------------
    Setting("ddplab_run_id", "str", "",
            "Run id. launch.yml: \"\" makes run-YYYYmmdd-HHMMSS; status/stop/collect_logs: \"\" = the last "
            "run launched on the master.", pattern=RUN_ID,
            pattern_doc=RUN_ID_DOC),
    Setting("ddplab_repo_dir", "str", "{{ playbook_dir | dirname }}",
            "The ddplab checkout on the control host."),
    Setting("ddplab_data_dir", "str", "{{ ddplab_repo_dir }}/data/shards",
            "Control-side shard folder with manifest.json (`make data` writes it); \"\" with your own code: "
            "nothing is copied or checked."),
    Setting("ddplab_runs_dir", "str", "{{ ddplab_repo_dir }}/runs",
            "Control-side folder where runs are collected (runs/<run_id>/)."),
    Setting("ddplab_secrets_dir", "str", "",
            "Control-side folder of the lab's secrets (the munge key of a Slurm lab), made 0700 with its "
            "missing parents; \"\" = ~/.config/ddplab/<lab tag> (8 hex digits from the master's address and "
            "ddplab_root), one per lab, so two labs share a key only when they name the same folder. Not "
            "under runs/, which people share and `make clean` deletes.",
            pattern=r"(~|/).*", pattern_doc="an absolute path or one under ~/",
            example="~/.config/ddplab/mylab"),
    Setting("ddplab_wheelhouse_dir", "str", "{{ ddplab_repo_dir }}/wheelhouse",
            "Control-side wheel folder (`make wheelhouse` fills it: the pinned CPU torch and its "
            "dependencies, and the wheels of ddplab_pip_requirements); what a node lacks is pushed and "
            "installed offline. Missing: pip uses the index."),
    Setting("ddplab_trainer_steps", "int", 50, "Built-in trainer: optimizer steps (--steps).", min=1),
    Setting("ddplab_trainer_depth", "int", 2, "Built-in trainer: transformer blocks (--depth).", min=1),
    Setting("ddplab_trainer_extra_args", "list", [],
            "Built-in trainer: more flags, as a list (python -m trainer --help).",
            example=["--batch-size", "8"]),
    Setting("ddplab_balance", "bool", False,
            "Built-in trainer: --balance, each rank's share of the global batch follows its measured speed "
            "(nodes of unequal speed finish each step together; the update equals the uniform one)."),
    Setting("ddplab_shard", "bool", False,
            "Built-in trainer: --shard, each node holds 1/N of the parameters, gradients and optimizer state "
            "(FSDP2), so the lab trains a model no single node holds; preflight advises it when DDP does "
            "not fit a node's memory. About 1.5x DDP's bytes per step; no balance, elastic or local SGD."),
    Setting("ddplab_threads", "int", 0,
            "Torch threads per rank (OMP/MKL_NUM_THREADS); 0 = the node's CPUs / the ranks that share them "
            "(hosts on one machine, such as simulated hosts, share its CPUs).",
            min=0, per_host=True),
    Setting("ddplab_rdzv_timeout", "int", 60,
            "Seconds every node has to join torchrun's static rendezvous (torchrun's own default is 600).",
            min=1),
    Setting("ddplab_pg_timeout", "int", PG_TIMEOUT_S,
            "Seconds a rank waits for a peer in a collective before it fails, naming the peer (torch's "
            "default is 30 minutes: a short value turns a hang into an error).", min=1),
    Setting("ddplab_max_restarts", "int", 0,
            "torchrun --max-restarts: restarts of a node's workers after a failure (0: fail at once).",
            min=0),
    Setting("ddplab_elastic", "bool", False,
            "Nodes that disappear: ranks start under torchrun's elastic agent with the rendezvous on the "
            "control host; a lost node (the master too) re-forms the group from the newest checkpoint a "
            "survivor holds, and a node started again joins the next group (built-in trainer: --elastic)."),
    Setting("ddplab_elastic_min_nodes", "int", 0,
            "ddplab_elastic: the fewest nodes that go on training (0: one less than the lab, at least 1).",
            min=0),
    Setting("ddplab_elastic_restarts", "int", 3,
            "ddplab_elastic: how many times the group may re-form after a failure (torchrun --max-restarts).",
            min=1),
    Setting("ddplab_rdzv_port", "int", 29400,
            "ddplab_elastic: TCP port of the rendezvous store on the control host (nodes must reach it).",
            min=1, max=65535),
    Setting("ddplab_scheduler", "str", "none",
            "How launch.yml starts the ranks: none = one tmux session per node (a second run is refused "
            "while one is live); slurm = one sbatch job over the lab's nodes (runs queue; slurm.yml "
            "makes the lab a Slurm cluster; ddplab_elastic is refused).", choices=("none", "slurm")),
    Setting("ddplab_slurm_controller", "str", "",
            "ddplab_scheduler slurm: the node that runs slurmctld (an inventory name); \"\" = the master."),
    Setting("ddplab_slurm_nodes", "int", 0,
            "ddplab_scheduler slurm: the run trains on the nodes of rank 0..N-1 only (the master and the "
            "next ranks), leaving the others free for other jobs; 0 = every node of the lab.", min=0),
    Setting("ddplab_slurm_allow_groups", "str", "",
            "ddplab_scheduler slurm: the groups whose members may run jobs on the lab's nodes (slurm.conf "
            "AllowGroups of its partition, names as on the controller, comma-separated); \"\" = the run "
            "user's own group (on the controller).",
            pattern=r"[A-Za-z_][A-Za-z0-9_.-]*(,[A-Za-z_][A-Za-z0-9_.-]*)*",
            pattern_doc="group names separated by commas, e.g. lab,students"),
    Setting("ddplab_slurmctld_port", "int", 6817,
            "ddplab_scheduler slurm: slurmctld's TCP port (opened to the lab's nodes only).",
            min=1, max=65535),
    Setting("ddplab_slurmd_port", "int", 6818,
            "ddplab_scheduler slurm: slurmd's TCP port on every node (opened to the lab's nodes only).",
            min=1, max=65535),
    Setting("ddplab_srun_ports", "str", "60001-60100",
            "ddplab_scheduler slurm: srun's port range (slurm.conf SrunPortRange; opened to the lab's nodes "
            "only).", pattern=r"[0-9]{1,5}-[0-9]{1,5}", pattern_doc="FIRST-LAST, e.g. 60001-60100"),
    Setting("ddplab_resume", "bool", False,
            "launch.yml: continue the run from its newest valid checkpoint on the master (also automatic "
            "when a reused ddplab_run_id finds checkpoints)."),
    Setting("ddplab_firewall_cleanup", "bool", False,
            "stop.yml: also remove every firewall rule ddplab added (tagged 'ddplab')."),
    Setting("ddplab_open_to_lan", "bool", False,
            "launch.yml: run even where a node's firewall is off (ufw inactive, none installed), its master "
            "port and gloo's ports open to every host of the network; without it launch refuses such a node "
            "(preflight's firewall row; prepare -e firewall_enable=true turns the firewall on instead)."),
    Setting("ddplab_prepare_always", "bool", False,
            "launch.yml: prepare every node even when every check passes (as prepare.yml would, then the "
            "launch), e.g. to copy the code again; without it a launch prepares only when a check fails."),
    Setting("ddplab_replace_running", "bool", False,
            "prepare.yml / launch.yml: also end a live run of this lab (its torchrun still running) on a "
            "node; without it such a run is refused with a message naming it (stop.yml ends it)."),
    Setting("ddplab_wait", "bool", False,
            "launch.yml: follow the run to its end (a progress line every ddplab_wait_poll s), then collect "
            "the logs into runs/<run_id>/ and fail if a rank did not exit 0."),
    Setting("ddplab_wait_timeout", "int", 3600, "launch.yml with ddplab_wait: longest wait (s).", min=1),
    Setting("ddplab_wait_poll", "int", 10, "launch.yml with ddplab_wait: seconds between progress lines.",
            min=1),
    Setting("ddplab_strict", "bool", True,
            "An unknown ddplab_* name (a typo) is an error; false: a warning."),
    # --- bring your own code -------------------------------------------------------------------------
    Setting("ddplab_code_dir", "str", "",
            "A folder on the control host synced to <ddplab_root>/code/<ddplab_code_subdir>/ on every node "
            "(what git would commit; .git never); \"\" = the built-in trainer. Needs ddplab_entrypoint.",
            section=CODE, example="/home/me/src/nanochat"),
    Setting("ddplab_code_subdir", "str", "user",
            "Folder under <ddplab_root>/code/ that ddplab_code_dir lands in.", section=CODE,
            pattern=r"(?!trainer$|nodeprobe$|\.\.?$)[A-Za-z0-9._-]+",
            pattern_doc="one folder name other than trainer, nodeprobe, . and .."),
    Setting("ddplab_entrypoint", "str", "",
            "A script relative to ddplab_code_dir (train.py) or \"-m package.module\".", section=CODE,
            example="-m scripts.base_train"),
    Setting("ddplab_entrypoint_args", "list", [], "Arguments of the entry point (each shell-quoted for you).",
            section=CODE, example=["--device-type=cpu", "--depth=4", "--num-iterations=20"]),
    Setting("ddplab_code_include", "list", [],
            "Globs relative to ddplab_code_dir of files to ship although git ignores them (prepared data, "
            "tokenizers; ** recurses); synced, hashed and checked by preflight like the code.", section=CODE,
            example=["data/**/*.bin", "data/**/meta.pkl"]),
    Setting("ddplab_sync_dirs", "list", [],
            "Folders of data that lives outside the code, each {src: a folder on the control host, dest: its "
            "node path, absolute or relative to ddplab_root}: every file of src is synced (rsync, only what "
            "changed, with progress), hashed and checked by preflight; files ddplab did not place are never "
            "removed from dest.", section=CODE, elements="dict",
            example=[{"src": "/home/me/datasets/owt", "dest": "data/owt"}]),
    Setting("ddplab_distribution", "str", "auto",
            "How the wheels, shards, ddplab_sync_dirs, ddplab_code_include and code reach the nodes: star = "
            "the control host sends each node its copy; relay = each changed file leaves the control host "
            "once, to the master, and the nodes pass it on (rsync over SSH with each node's own key, which "
            "may only send files into a peer's staging folder; a file is placed only when its sha256 is "
            "the control host's; removed by stop.yml -e ddplab_firewall_cleanup=true); auto = relay from 3 "
            "nodes on. Without node-to-node SSH (a local node, no rsync) prepare says why and uses star.",
            choices=("auto", "star", "relay")),
    Setting("ddplab_code_check", "bool", True,
            "Scan the entry point and the modules it imports (Python ast, nothing run) for what fails on CPU "
            "nodes under gloo, before any node changes; a certain failure refuses the launch (file:line and "
            "the patch). false: skip (python -m ddplab code-check runs it by hand).", section=CODE),
    Setting("ddplab_smoke_run", "bool", True,
            "Before the ranks start, run your entry point on the master as 2 CPU ranks over loopback "
            "gloo (a scratch copy of the code, ddplab_smoke_seconds at most) and refuse a crash, no process "
            "group, no collective or ranks whose parameters differ; it decides over the CPU check's guesses. "
            "A pass is remembered for unchanged code, arguments, ddplab_env and torch. false: the CPU check "
            "decides.",
            section=CODE),
    Setting("ddplab_smoke_seconds", "int", 90,
            "ddplab_smoke_run: the longest it runs (it stops once both ranks made 2 optimizer steps; with "
            "ddplab_smoke_whole, each of its passes); with no step by then it judges nothing and the CPU "
            "check decides.", section=CODE, min=10, max=3600),
    Setting("ddplab_smoke_whole", "bool", False,
            "ddplab_smoke_run: run the entry point to its end (every rank must exit 0) with "
            "ddplab_smoke_args, and where a rank saved a checkpoint (torch.save) a second pass that resumes "
            "from it; on by itself when ddplab_smoke_args is set. false: stop after 2 optimizer steps.",
            section=CODE),
    Setting("ddplab_smoke_args", "list", [],
            "The arguments of a whole short run of the entry point for the smoke run (a few iterations, an "
            "evaluation, a checkpoint); setting them turns ddplab_smoke_whole on. [] = "
            "ddplab_entrypoint_args.", section=CODE,
            example=["--max_iters=4", "--eval_interval=2", "--eval_iters=2",
                     "--always_save_checkpoint=True"]),
    Setting("ddplab_smoke_resume_args", "list", [],
            "ddplab_smoke_args: the arguments of the second pass, which resumes from the checkpoint the "
            "first saved, in the same scratch copy ([] = ddplab_smoke_args again, for code that resumes "
            "when it finds its checkpoint).", section=CODE,
            example=["--max_iters=6", "--eval_interval=2", "--eval_iters=2", "--init_from=resume"]),
    Setting("ddplab_workdir", "str", "code",
            "Working folder of your code's ranks: code = its synced folder on the node (as torchrun from a "
            "checkout), run = <ddplab_root>/runs/<run_id>/. Files your code writes are never removed by a "
            "later sync; the ranks get DDPLAB_RUN_DIR.", section=CODE, choices=("code", "run")),
    Setting("ddplab_env", "dict", {},
            "Extra environment variables of the ranks (per group or host; ddplab's own names are refused).",
            section=CODE, per_host=True,
            example={"NANOCHAT_BASE_DIR": "/data/nanochat", "PET_LOG_DIR": "torchrun-logs"}),
    Setting("ddplab_nproc_per_node", "int", 1,
            "torchrun ranks on the node; may differ per host (a desktop 2, a laptop 1): the world size is "
            "the sum, and each rank's threads default to the node's CPUs / the ranks that share them.",
            section=CODE, min=1, max=1024, per_host=True),
    Setting("ddplab_collect_globs", "list", [],
            "Files your code writes, relative to the ranks' working folder on the node (ddplab_workdir; ** "
            "recurses), brought back by collect_logs.", section=CODE,
            example=["out/*.json", "torchrun-logs/**/*.log"]),
    Setting("ddplab_log_pattern", "str", "",
            "Python regex for the lines your code prints (read from each rank's launch.log for status.yml, "
            "report.md and loss.png), with named groups among " + ", ".join(log_metrics.FIELDS) + " (step "
            "required; thousands separators allowed); \"\" = recognise nanoGPT's and nanochat's lines. The "
            "run's tokens/s is the sum over the nodes' logs: print it per node or from rank 0 only.",
            section=CODE,
            example=r"^step (?P<step>\d+)/(?P<total>\d+) loss (?P<loss>\S+) (?P<tokens_per_sec>[\d,.]+)"),
    Setting("ddplab_pip_requirements", "str", "",
            "A requirements file inside ddplab_code_dir, installed with torch==ddplab_torch_version as a "
            "constraint (\"\" = none).", section=CODE, example="requirements.txt"),
    # --- per inventory host --------------------------------------------------------------------------
    Setting("ddplab_node_rank", "int", None, "0 for the master, then 1, 2, ... (unique).", section=HOST,
            min=0, per_host=True, required=True),
    Setting("ddplab_addr", "str", None,
            "IPv4 address the other nodes use for this one (default: ansible_host).", section=HOST,
            per_host=True),
    Setting("ddplab_simlan", "bool", None, "Written by simlan: the host is a simulated one.", section=HOST,
            per_host=True),
)

BY_NAME = {s.name: s for s in SETTINGS}

# Facts the roles set at run time (roles/ddplab/tasks, playbooks): never settings, never reported.
INTERNAL = frozenset({
    "ddplab_lab", "ddplab_run", "ddplab_run_dir", "ddplab_control_run_dir", "ddplab_master_host",
    "ddplab_master_addr", "ddplab_node_addr", "ddplab_world_size", "ddplab_run_hosts", "ddplab_all_local",
    "ddplab_last_run", "ddplab_run_id_mode", "ddplab_root_abs", "ddplab_rank_cwd",
    # roles/lab_facts (facts and the task vars that build them) and the --limit plays
    "ddplab_addrs", "ddplab_byo", "ddplab_master_lab", "ddplab_master_root_abs", "ddplab_left_out",
    "ddplab_dirs_made", "ddplab_slurm_controller_host", "ddplab_run_chosen",
    # roles/plan: the command's plan (ddplab/plan.py), read by every later play
    "ddplab_plan",
    # not a variable: the action plugin plugins/action/ddplab_control.py
    "ddplab_control",
})


def defaults_section(section: str) -> list[Setting]:
    return [s for s in SETTINGS if s.section == section]
