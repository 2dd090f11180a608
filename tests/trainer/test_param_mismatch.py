"""The cross-rank parameter check fails a run whose ranks drifted apart: exit 3, the ranks named.

Two real ranks over gloo on localhost, started as torchrun would (RANK, WORLD_SIZE, MASTER_* in the
environment) so each rank's own exit code is seen; rank 1's parameters are nudged after step 2 by
tests/helpers/perturbed_trainer.py (an optimizer post-hook, nothing in trainer/ changes).
"""

import subprocess
import sys

import pytest

from tests.helpers.trainer_runs import REPO, TINY, env, error_lines, free_port

pytestmark = pytest.mark.slow


def _start(rank: int, port: int, args: list, after_step: int = 2) -> subprocess.Popen:
    e = env() | {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PERTURB_RANK": "1",
                 "PERTURB_AFTER_STEP": str(after_step)}
    return subprocess.Popen([sys.executable, "-m", "tests.helpers.perturbed_trainer", *map(str, args)],
                            cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("check_every, caught_after", [(0, 4), (2, 2)])
def test_ranks_with_different_parameters_exit_3_and_claim_no_byte_equality(shards, tmp_path, check_every,
                                                                         caught_after):
    out = tmp_path / "out"
    args = ["--data", shards, "--out", out, "--steps", "4", "--check-every", check_every, *TINY]
    port = free_port()
    procs = [_start(rank, port, args) for rank in (0, 1)]
    results = [p.communicate(timeout=120) for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [3, 3], [err[-2000:] for _, err in results]
    for _, err in results:
        lines = error_lines(err)
        assert len(lines) == 1, err[-2000:]
        assert lines[0].startswith(f"ddplab: error: parameters differ after step {caught_after}: rank 0 on ")
        assert " vs rank 1 on " in lines[0] and "rank 0 " in lines[0]
    # the run stopped at the check: no summary is written, so none can claim byte equality
    assert sorted(p.name for p in out.glob("summary*.json")) == []
    assert (out / "config.json").exists()  # the run did start and write its resolved config


def test_ranks_whose_initial_parameters_differ_get_rank_0s_and_train_one_model(shards, tmp_path):
    # ranks that start equal skip DDP's broadcast of the whole model (tests/trainer/test_ddp.py); ranks
    # that do not (another CPU's random-number kernel) must still train one model: DDP broadcasts rank 0's
    out = tmp_path / "out"
    args = ["--data", shards, "--out", out, "--steps", "3", "--check-every", "1", *TINY]
    port = free_port()
    procs = [_start(rank, port, args, after_step=0) for rank in (0, 1)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    assert "ddplab: the ranks' initial parameters differ" in results[0][0]
    assert (out / "summary.json").exists()  # --check-every 1: the checksums agreed after every step
