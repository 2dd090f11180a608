"""The relay's cleanup (stop.yml --tags firewall_cleanup) removes only the two files roles/relay_ssh placed
in <lab>/.relay, and the folder only when nothing else is in it: a file the user put there stays.
Local inventory (no SSH, no root)."""

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
    extra = {"ddplab_master_port": free_port()}
    for attempt in (1, 2):
        proc = playbook("stop.yml", "--tags", "firewall_cleanup", extra=extra, env={"HOME": str(home)},
                        timeout=300)
        assert proc.returncode == 0, tail(proc)
        if attempt == 2:
            assert all(r["changed"] == 0 for r in recap(proc).values()), tail(proc)
    assert not (home / "ddplab" / "local0" / ".relay").exists()
    assert sorted(p.name for p in mine.parent.iterdir()) == ["notes.txt"]
    assert mine.read_text() == "the user's\n"
