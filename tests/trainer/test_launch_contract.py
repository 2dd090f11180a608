"""trainer/launch_contract.py is the one home of the run-id form and the rendezvous port: the control
side (settings, the plan that run_id.yml reads) and the trainer accept the same run ids and make them the same
way."""

import re
import time

import pytest

from ddplab import plan
from ddplab.settings.spec import SETTINGS
from ddplab.settings.values import coerce
from tests.helpers.trainer_runs import REPO
from trainer.config import TrainConfig, UsageError
from trainer.launch_contract import MASTER_PORT, RUN_ID, RUN_ID_TIME_FORMAT, is_run_id, new_run_id

SPEC = {s.name: s for s in SETTINGS}
INV = {"groups": {"ddplab_nodes": ["n0"], "ddplab_master": ["n0"]}, "hosts": {"n0": {"vars": {}}}}
IDS = ["run-1", "r", "run-20261126-113000-ab12cd", "a.b_c-D9", "A" * 64, "A" * 65, "-x", ".x", "_x",
       "a/b", "a b", "é", "run:1", "x\n"]


def _trainer_accepts(run_id: str) -> bool:
    try:
        TrainConfig(data="d", out="o", run_id=run_id)
    except UsageError:
        return False
    return True


@pytest.mark.parametrize("run_id", IDS)
def test_the_trainer_and_the_settings_accept_the_same_run_ids(run_id):
    accepted_by_settings = coerce(SPEC["ddplab_run_id"], run_id)[1] is None
    assert _trainer_accepts(run_id) == accepted_by_settings == is_run_id(run_id)


def test_run_id_yml_spells_no_run_id_form_and_the_plan_makes_them_as_the_contract_says():
    text = (REPO / "roles/ddplab/tasks/run_id.yml").read_text()
    assert RUN_ID not in text and RUN_ID_TIME_FORMAT not in text and "now(" not in text
    assert "ddplab_plan.run_id_pattern" in text
    made = plan.new_run_id(time.mktime((2026, 11, 26, 9, 5, 7, 0, 0, -1)))
    assert is_run_id(made) and re.fullmatch(r"run-20261126-090507-[a-z0-9]{6}", made)
    assert re.fullmatch(plan.decide(INV, "launch")["run_id_pattern"], made)


def test_a_generated_run_id_is_a_run_id_of_the_time():
    now = time.mktime((2026, 11, 26, 9, 5, 7, 0, 0, -1))
    assert new_run_id(now) == "run-20261126-090507"
    assert is_run_id(new_run_id()) and re.fullmatch(r"run-\d{8}-\d{6}", new_run_id())


def test_the_master_port_default_is_the_contracts():
    assert SPEC["ddplab_master_port"].default == MASTER_PORT == 29500
