"""TrainConfig: derived sizes, validation messages, CLI flags."""

import dataclasses
import subprocess
import sys

import pytest

from tests.helpers.trainer_runs import REPO, env
from trainer.cli import check_args, command_line, parse_config
from trainer.config import FIELD_HELP, TrainConfig, UsageError


def test_depth_sets_width_and_heads():
    c = TrainConfig(data="d", out="o", depth=3)
    assert (c.n_embd, c.n_head) == (192, 3)
    c = TrainConfig(data="d", out="o", depth=1)
    assert (c.n_embd, c.n_head) == (64, 1)
    c = TrainConfig(data="d", out="o", depth=2, n_embd=96, n_head=2)
    assert (c.n_embd, c.n_head) == (96, 2)


@pytest.mark.parametrize("kw, words", [
    ({"n_embd": 100, "n_head": 3}, "not divisible"),
    ({"n_embd": 6, "n_head": 2}, "even"),
    ({"depth": 0}, "--depth"),
    ({"steps": 0}, "--steps"),
    ({"batch_size": 0}, "--batch-size"),
    ({"lr": -1.0}, "--lr"),
    ({"seq_len": 1}, "--seq-len"),
    ({"dtype": "fp8"}, "--dtype"),
    ({"comm": "carrier-pigeon"}, "--comm"),
    ({"pg_timeout_s": 1}, "--pg-timeout-s"),
    ({"run_id": "a b/c"}, "--run-id"),
    ({"data": ""}, "--data"),
])
def test_invalid_settings_raise_clear_usage_errors(kw, words):
    base = {"data": "d", "out": "o"} | kw
    with pytest.raises(UsageError, match=words):
        TrainConfig(**base)


def test_every_field_has_help_and_a_kebab_flag():
    fields = [f.name for f in dataclasses.fields(TrainConfig) if not f.name.startswith("_")]
    assert set(fields) == set(FIELD_HELP)
    out = subprocess.run([sys.executable, "-m", "trainer", "--help"], cwd=REPO, env=env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for name in fields:
        assert "--" + name.replace("_", "-") in out.stdout


def test_flags_map_onto_fields_and_config_roundtrips_as_json():
    c = parse_config(["--data", "d", "--out", "o", "--steps", "7", "--depth", "2", "--grad-accum", "3",
                      "--bucket-cap-mb", "1.5", "--resume", "--pg-timeout-s", "30"])
    assert (c.steps, c.depth, c.grad_accum, c.bucket_cap_mb) == (7, 2, 3, 1.5)
    assert (c.resume, c.pg_timeout_s) == (True, 30)
    again = TrainConfig(**{k: v for k, v in c.to_dict().items()})
    assert again.to_dict() == c.to_dict()


BASE = ["--data", "d", "--out", "o"]


@pytest.mark.parametrize("argv, line", [
    (BASE + ["--depth", "99"], "trainer argument --depth: 99 given; --depth must be in 1..64"),
    (BASE + ["--depth", "x"], "trainer argument --depth: invalid int value: 'x'; a whole number"),
    (BASE + ["--lr", "fast"], "trainer argument --lr: invalid float value: 'fast'; a number"),
    (BASE + ["--comm", "pigeon"],
     "trainer argument --comm: invalid choice: 'pigeon'; one of fp32, bf16, fp16, powersgd, auto, int8, "
     "int4"),
    (BASE + ["--resume=yes"],
     "trainer argument --resume: ignored explicit argument 'yes'; --resume takes no value"),
    (BASE + ["--bogus", "1"], "trainer argument --bogus 1: unknown flag; the flags are those listed by "
                              "`python -m trainer --help`"),
    (["--depth", "2"], "trainer argument --data, --out: not given; required by every run (the launch role "
                       "passes them)"),
    (BASE + ["--run-id", "a/b"],
     "trainer argument --run-id: 'a/b' given; --run-id must be letters, digits, '.', '_' and '-' "
     "(at most 64, starting with a letter or digit)"),
    (BASE + ["--n-embd", "6", "--n-head", "2"],
     "trainer argument --n-embd/--n-head: head size 3 (n_embd/n_head) must be even for rotary embeddings"),
])
def test_check_args_names_the_argument_and_what_is_allowed(argv, line):
    assert check_args(argv) == line


def test_check_args_accepts_what_the_launch_role_passes():
    assert check_args(BASE + ["--run-id", "run-1", "--steps", 50, "--depth", 2, "--pg-timeout-s", "45",
                              "--resume", "--threads", "1", "--comm", "auto"]) is None


def test_check_args_cli_needs_no_torch_and_exits_2_with_one_line():
    probe = ("import runpy, sys\n"
             "sys.argv = ['trainer', '--check-args', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('trainer', run_name='__main__')\n"
             "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n")
    ok = subprocess.run([sys.executable, "-c", probe, *BASE, "--depth", "3"], cwd=REPO, env=env(),
                        capture_output=True, text=True, timeout=60)
    assert (ok.stdout.split(), ok.stderr) == (["0", "False"], "")
    bad = subprocess.run([sys.executable, "-m", "trainer", "--check-args", *BASE, "--steps", "0"], cwd=REPO,
                         env=env(), capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == ["ddplab: error: trainer argument --steps: 0 given; --steps must be at "
                                       "least 1"]



@pytest.mark.parametrize("argv, code, out", [
    (["--help"], 0, "usage:"),
    ([*BASE, "--steps", "many"], 2, "ddplab: error: argument --steps: invalid int value: 'many'"),
    ([*BASE, "--n-embd", "100", "--n-head", "3"], 2, "ddplab: error: --n-embd 100 is not divisible"),
])
def test_help_and_bad_flags_answer_before_torch_is_imported(argv, code, out):
    probe = ("import runpy, sys\n"
             "sys.argv = ['trainer', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('trainer', run_name='__main__')\n"
             "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules, file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", probe, *map(str, argv)], cwd=REPO, env=env(),
                       capture_output=True, text=True, timeout=60)
    assert out in p.stdout + p.stderr
    assert p.stderr.splitlines()[-1] == f"exit {code} False", p.stderr

def test_command_line_spells_each_field_as_the_parser_reads_it():
    """What the launcher passes (ddplab/trainer_flags.py) parses back to the same values with the trainer's
    own parser; a switch appears only when it differs from its default; an unknown field is refused."""
    values = {"data": "/d", "out": "/o", "run_id": "r-1", "steps": 7, "pg_timeout_s": 30.0,
              "resume": True, "balance": False, "powersgd_warm_start": False}
    argv = command_line(values)
    assert argv == ["--data", "/d", "--out", "/o", "--run-id", "r-1", "--steps", "7", "--pg-timeout-s",
                    "30.0", "--resume", "--no-powersgd-warm-start"]
    cfg = parse_config(argv)
    assert {k: getattr(cfg, k) for k in values} == values
    with pytest.raises(ValueError, match="no setting 'stpes'"):
        command_line({"stpes": 7})


def test_launch_flags_name_the_settings_and_the_trainer_accepts_them():
    from ddplab.trainer_flags import FLAG_SETTING, SETTING_FIELD, launch_flags

    settings = {"ddplab_trainer_steps": 9, "ddplab_trainer_depth": 3, "ddplab_pg_timeout": 40,
                "ddplab_balance": True, "ddplab_elastic": False, "ddplab_shard": False,
                "ddplab_trainer_extra_args": ["--lr", "0.01"]}
    argv = launch_flags(settings, "/lab/data", "/lab/runs/r/out", "r", resume=True)
    assert argv[-2:] == ["--lr", "0.01"] and argv.index("--resume") > argv.index("--pg-timeout-s")
    cfg = parse_config(argv)
    for name, field in SETTING_FIELD.items():
        assert getattr(cfg, field) == settings[name], name
    assert (cfg.data, cfg.out, cfg.run_id, cfg.resume, cfg.lr) == ("/lab/data", "/lab/runs/r/out", "r", True,
                                                                    0.01)
    assert FLAG_SETTING["--pg-timeout-s"] == "ddplab_pg_timeout"
    assert FLAG_SETTING["--threads"] == "ddplab_threads"


@pytest.mark.parametrize("argv, flags", [
    (["--balance"], "--balance"),
    (["--sync-every", "4", "--allow-local-sgd"], "--sync-every 4"),
    (["--elastic"], "--elastic"),
    (["--comm", "bf16"], "--comm bf16"),
    (["--balance", "--elastic"], "--balance, --elastic"),
])
def test_shard_refuses_what_it_cannot_combine_with_in_one_line_naming_the_flags(argv, flags):
    line = check_args(["--data", "d", "--out", "o", "--shard", *argv])
    assert f"--shard with {flags}: sharded training (FSDP2)" in line and "\n" not in line
    assert line.endswith("or --shard")
    assert check_args(["--data", "d", "--out", "o", "--shard"]) is None
    assert "add --shard" in check_args(["--data", "d", "--out", "o", "--no-reshard-after-forward"])
    assert "add --shard" in check_args(["--data", "d", "--out", "o", "--no-shard-return-memory"])
    assert check_args(["--data", "d", "--out", "o", "--shard", "--no-shard-return-memory"]) is None
