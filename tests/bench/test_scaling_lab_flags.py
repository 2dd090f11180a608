"""The scaling lab's run labels map onto the trainer's flags, and the trainer accepts each of them."""

import pytest

from bench import scaling_lab
from trainer.cli import check_args


@pytest.mark.parametrize("label, want", [
    ("fp32", ["--comm", "fp32"]),
    ("powersgd", ["--comm", "powersgd"]),
    ("local16", ["--comm", "fp32", "--sync-every", "16", "--allow-local-sgd"]),
    ("local8-bf16", ["--comm", "bf16", "--sync-every", "8", "--allow-local-sgd"]),
    ("local4-bf16-avg", ["--comm", "bf16", "--sync-every", "4", "--allow-local-sgd", "--outer-lr", "1",
                         "--outer-momentum", "0"]),
    ("local16-avg", ["--comm", "fp32", "--sync-every", "16", "--allow-local-sgd", "--outer-lr", "1",
                     "--outer-momentum", "0"]),
    ("local2-bf16-avg-ovl", ["--comm", "bf16", "--sync-every", "2", "--allow-local-sgd", "--outer-lr", "1",
                             "--outer-momentum", "0", "--sync-overlap"]),
    ("local8-bf16-avg-ovl-f4", ["--comm", "bf16", "--sync-every", "8", "--allow-local-sgd", "--outer-lr", "1",
                                "--outer-momentum", "0", "--sync-overlap", "--sync-fragments", "4"]),
    ("local4-bf16-avg-ovl-f4-qsr", ["--comm", "bf16", "--sync-every", "4", "--allow-local-sgd", "--outer-lr",
                                    "1", "--outer-momentum", "0", "--sync-overlap", "--sync-fragments", "4",
                                    "--sync-schedule", "qsr"]),
    ("local5-bf16-invlr", ["--comm", "bf16", "--sync-every", "5", "--allow-local-sgd", "--sync-schedule",
                           "inverse-lr"]),
])
def test_a_label_becomes_trainer_flags_the_trainer_accepts(label, want):
    assert scaling_lab.comm_flags(label) == want
    assert check_args(["--data", "d", "--out", "o", *want]) is None


def test_every_size_names_comms_the_lab_can_run():
    for size, spec in scaling_lab.SIZES.items():
        for comm in spec["comms"]:
            flags = scaling_lab.comm_flags(comm)
            assert check_args(["--data", "d", "--out", "o", *spec["model"], *flags]) is None, (size, comm)


def test_comms_takes_every_label_comm_flags_knows_and_names_the_wrong_one(capsys):
    assert scaling_lab.main(["--comms", "local16-bf16-avg,local8,fp32,local4-fast"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddplab: error: --comms takes ")
    assert err[0].endswith("got local4-fast")
