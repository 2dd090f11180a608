"""Each role's README shows an example play that runs as typed: it passes `ansible-playbook --syntax-check`,
and it lists what the role reads that another role sets (roles/lab_facts' facts; the run id of roles/ddplab's
run_id.yml, from roles/plan's ddplab_plan), as the playbooks do. A cheap subset runs for real on a prepared
cluster (tests/orchestrator/test_limit_simlan.py)."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.helpers.playbooks import BIN, REPO

ROLES = REPO / "roles"
# the facts another role sets, and the role (or task file) that sets them
LAB_FACTS = ("ddplab_lab", "ddplab_master_host", "ddplab_master_addr", "ddplab_master_lab",
             "ddplab_node_addr", "ddplab_addrs", "ddplab_world_size", "ddplab_run_hosts", "ddplab_byo",
             "ddplab_slurm_controller_host")
RUN_ID_FACTS = ("ddplab_run", "ddplab_run_dir", "ddplab_rank_cwd", "ddplab_control_run_dir")


def example(role: str) -> str | None:
    """The README's example play (its first ```yaml block that is a play), or None."""
    text = (ROLES / role / "README.md").read_text()
    return next((b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if b.startswith("- name:")), None)


EXAMPLES = {r.name: example(r.name) for r in sorted(ROLES.iterdir()) if (r / "README.md").exists()}


def reads(role: str, names: tuple[str, ...]) -> bool:
    """Whether the role's own files (not the one that sets them) read any of `names`."""
    files = [p for p in (ROLES / role).rglob("*") if p.suffix in (".yml", ".j2") and p.is_file()]
    text = "".join(p.read_text() for p in files if not (role == "ddplab" and p.name == "run_id.yml"))
    return any(re.search(rf"\b{name}\b", text) for name in names)


def test_every_role_with_tasks_of_its_own_shows_an_example():
    # node_prereqs and slurm run only inside roles/prepare and slurm.yml, with what those set before them
    assert {role for role, play in EXAMPLES.items() if not play} == {"node_prereqs", "slurm"}


def test_each_example_lists_the_roles_that_set_what_it_reads():
    missing = []
    for role, play in EXAMPLES.items():
        if not play or role == "lab_facts":
            continue
        listed = yaml.safe_load(play)[0]
        included = [t["ansible.builtin.include_role"] for t in listed.get("tasks", [])
                    if "ansible.builtin.include_role" in t]
        names = [r["role"] for r in listed.get("roles", [])] + [
            f"{i['name']}:{i.get('tasks_from', '')}" for i in included]
        if reads(role, LAB_FACTS) and "lab_facts" not in names:
            missing.append(f"{role}: lab_facts")
        if reads(role, RUN_ID_FACTS) and not {"ddplab:run_id", "plan"} <= set(names):
            missing.append(f"{role}: plan and ddplab's run_id (the run id)")
        if "ddplab" not in names:
            missing.append(f"{role}: ddplab (every setting's default)")
    assert missing == []


def test_each_example_passes_syntax_check(tmp_path):
    plays = []
    for role, play in EXAMPLES.items():
        if play:
            (tmp_path / f"{role}.yml").write_text(play)
            plays.append(str(tmp_path / f"{role}.yml"))
    argv = [str(BIN / "ansible-playbook"), "--syntax-check", "-i", "inventory/example", *plays]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
