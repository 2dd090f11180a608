"""The relay's cleanup (stop.yml --tags firewall_cleanup) removes only the two files roles/relay_ssh placed
in <lab>/.relay, and the folder only when nothing else is in it: a file the user put there stays. On the
control host it removes the lab relay key pair an older ddplab made in runs/.relay, and only that pair.
Local inventory (no SSH, no root)."""

import subprocess

import pytest

from tests.helpers.playbooks import playbook, recap, tail
from tests.helpers.trainer_runs import free_port

pytestmark = pytest.mark.slow


def test_cleanup_keeps_a_file_ddplab_did_not_place(tmp_path):
    home = tmp_path / "home"
    for lab in ("local0", "local1"):
        relay = home / "ddplab" / lab / ".relay"
        relay.mkdir(parents=True)
        (relay.parent / ".ddplab-lab").write_text("")
        (relay / "id_ed25519").write_text("key\n")
        (relay / "known_hosts").write_text("hosts\n")
    mine = home / "ddplab" / "local1" / ".relay" / "notes.txt"
    mine.write_text("the user's\n")
    # the older ddplab's control-side lab key (ssh-keygen -C ddplab-relay), and in a second runs folder a
    # pair of the user's with ddplab's names: another comment, so it stays
    runs, theirs = tmp_path / "runs", tmp_path / "runs-mine"
    for folder, comment in ((runs, "ddplab-relay"), (theirs, "me@laptop")):
        (folder / ".relay").mkdir(parents=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f",
                        str(folder / ".relay" / "id_ed25519")], check=True, timeout=60)
    extra = {"ddplab_master_port": free_port(), "ddplab_runs_dir": str(runs)}
    for attempt in (1, 2):
        proc = playbook("stop.yml", "--tags", "firewall_cleanup", extra=extra, env={"HOME": str(home)},
                        timeout=300)
        assert proc.returncode == 0, tail(proc)
        if attempt == 2:
            assert all(r["changed"] == 0 for r in recap(proc).values()), tail(proc)
    assert not (home / "ddplab" / "local0" / ".relay").exists()
    assert sorted(p.name for p in mine.parent.iterdir()) == ["notes.txt"]
    assert mine.read_text() == "the user's\n"
    assert not (runs / ".relay").exists()
    again = playbook("stop.yml", "--tags", "firewall_cleanup", env={"HOME": str(home)}, timeout=300,
                     extra={**extra, "ddplab_runs_dir": str(theirs)})
    assert again.returncode == 0, tail(again)
    assert sorted(p.name for p in (theirs / ".relay").iterdir()) == ["id_ed25519", "id_ed25519.pub"]
