"""--shard: real FSDP2 runs under torchrun on localhost (gloo): the same losses as DDP, the collectives
counted, the ranks agreeing on the gathered parameters, DCP checkpoints that resume on 3 ranks what 2
wrote."""

import json
import shutil

import pytest
import torch.distributed.checkpoint as dcp

from tests.helpers.trainer_runs import TINY, read_jsonl, torchrun
from trainer.agreement import param_sha256
from trainer.model import GPT, GPTConfig, param_count

pytestmark = pytest.mark.slow

STEPS = 8
# the shared-stream data position of --shard is --elastic's: DDP --elastic reads the same batches
ARGS = ["--steps", STEPS, *TINY, "--ckpt-every", "4", "--check-every", "4", "--log-every", "1"]


@pytest.fixture(scope="module")
def sharded(small_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("shard") / "out"
    r = torchrun(["--data", small_shards, "--out", out, *ARGS, "--shard"])
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def summary(out, name="summary.json"):
    return json.loads((out / name).read_text())


def dcp_sha(folder, cfg: dict) -> str:
    """The checksum of a DCP checkpoint's model loaded on one process, unsharded (the reference)."""
    m = GPT(GPTConfig(seq_len=cfg["seq_len"], n_layer=cfg["depth"], n_embd=cfg["n_embd"],
                      n_head=cfg["n_head"]))
    sd = {"model": m.state_dict()}
    dcp.load(sd, checkpoint_id=folder)
    m.load_state_dict(sd["model"])
    return param_sha256(m)


def test_each_rank_holds_half_and_the_collectives_are_counted(sharded):
    out, r = sharded
    s = summary(out)
    assert "sharded (FSDP2) over 2 ranks" in r.stdout
    assert sum(s["shard"]["params_local"]) == s["params"] == param_count(GPTConfig(seq_len=32, n_layer=1,
                                                                                   n_embd=64, n_head=1))
    assert all(n < s["params"] * 0.6 for n in s["shard"]["params_local"])
    # the defaults (docs/shard.md): reshard after forward, freed buffers back to the system
    assert s["shard"]["reshard_after_forward"] is True and s["shard"]["return_memory"] is True
    # 2 all-gathers of each block (forward, backward) + 1 of the root; 1 reduce-scatter of everything; fp32
    block, root = 12 * 64 * 64 * 4, 2 * 257 * 64 * 4
    assert 2 * block + root <= s["shard"]["allgather_bytes_per_step"] < 2 * block + root + 4096
    assert s["params"] * 4 <= s["shard"]["reduce_scatter_bytes_per_step"] < s["params"] * 4 + 4096
    for rank in (0, 1):
        recs = read_jsonl(out / f"metrics.rank{rank}.jsonl")
        assert all(rec["allgather_ms"] > 0 and rec["reduce_scatter_ms"] > 0 for rec in recs)
        assert all(rec["allreduce_bytes"] == rec["allgather_bytes"] + rec["reduce_scatter_bytes"]
                   for rec in recs)


def test_ranks_agree_on_the_gathered_parameters_and_the_checkpoint_holds_them(sharded):
    out, _ = sharded
    s = summary(out)
    s0, s1 = summary(out, "summary.rank0.json"), summary(out, "summary.rank1.json")
    assert s["byte_equivalent"] and s0["final_param_sha256"] == s1["final_param_sha256"]
    cfg = json.loads((out / "config.json").read_text())
    ckpt = out / "ckpt" / f"step_{STEPS:06d}.dcp"
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "MANIFEST.sha256", "__0_0.distcp",
                                                     "__1_0.distcp", "run.pt"]
    assert dcp_sha(ckpt, cfg) == s["final_param_sha256"]
    assert not list((out / "ckpt").glob(".*tmp*"))  # each rank's staging folder is gone


def test_same_losses_as_ddp_at_equal_tokens(sharded, small_shards, tmp_path):
    out, _ = sharded
    ddp = tmp_path / "ddp"
    r = torchrun(["--data", small_shards, "--out", ddp, *ARGS, "--elastic"])
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = read_jsonl(out / "metrics.rank0.jsonl"), read_jsonl(ddp / "metrics.rank0.jsonl")
    assert [x["tokens_seen"] for x in a] == [x["tokens_seen"] for x in b]
    for x, y in zip(a, b, strict=True):
        if "loss_mean" in x:
            assert x["loss_mean"] == pytest.approx(y["loss_mean"], abs=2e-3)
    assert summary(out)["val_loss"] == pytest.approx(summary(ddp)["val_loss"], abs=2e-3)
    assert summary(out)["val_loss"] < summary(out)["loss_first"]


def test_resumes_on_three_ranks_with_the_parameters_two_saved(sharded, tmp_path):
    out, _ = sharded
    moved = tmp_path / "out"
    shutil.copytree(out, moved)
    shutil.rmtree(moved / "ckpt" / f"step_{STEPS:06d}.dcp")  # the run continues from step 4
    r = torchrun(["--data", _data(out), "--out", moved, *ARGS, "--shard", "--resume"], nproc=3)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout and "at step 4" in r.stdout
    s = summary(moved)
    assert s["world_size"] == 3 and len(s["shard"]["params_local"]) == 3 and s["byte_equivalent"]
    per_rank_step = 4 * 32  # --batch-size x --seq-len
    assert s["resumed_from_step"] == 4 and s["tokens_seen"] == 4 * 2 * per_rank_step + 4 * 3 * per_rank_step
    ckpt = moved / "ckpt" / f"step_{STEPS:06d}.dcp"
    assert {p.name for p in ckpt.glob("__*.distcp")} == {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp"}
    assert dcp_sha(ckpt, json.loads((moved / "config.json").read_text())) == s["final_param_sha256"]
    assert s["val_loss"] < s["loss_first"]


def _data(out):
    return json.loads((out / "config.json").read_text())["data"]


def test_a_finished_run_resumed_on_three_ranks_holds_exactly_what_two_saved(sharded, tmp_path):
    out, _ = sharded
    moved = tmp_path / "out"
    shutil.copytree(out, moved)
    r = torchrun(["--data", _data(out), "--out", moved, *ARGS, "--shard", "--resume"], nproc=3)
    assert r.returncode == 0, r.stderr[-3000:]
    # no step left: the checksum the 3 ranks agree on is that of the 2 ranks' shards, resharded in 3
    assert summary(moved)["final_param_sha256"] == summary(out)["final_param_sha256"]
