"""nodeprobe/prereqs.py: os-release parsing, the family, what is missing (pure), and one real run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nodeprobe import prereqs

REPO = Path(__file__).resolve().parents[2]


def test_os_release_values_are_unquoted_and_junk_is_skipped():
    text = '# comment\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n\nbroken line\nID_LIKE=\'x y\'\n'
    assert prereqs.parse_os_release(text) == {"NAME": "Debian GNU/Linux", "VERSION_ID": "12", "ID": "debian",
                                              "ID_LIKE": "x y"}


def test_family_is_debian_for_debian_ubuntu_and_their_derivatives_only():
    assert prereqs.os_family({"ID": "debian"}) == "Debian"
    assert prereqs.os_family({"ID": "ubuntu", "ID_LIKE": "debian"}) == "Debian"
    assert prereqs.os_family({"ID": "linuxmint", "ID_LIKE": "ubuntu debian"}) == "Debian"
    assert prereqs.os_family({"ID": "fedora", "NAME": "Fedora Linux"}) == "Fedora Linux"
    assert prereqs.os_family({"ID": "arch", "NAME": "Arch Linux"}) == "Arch Linux"
    assert prereqs.os_family({}) == "unknown"


def test_missing_commands_name_their_packages_once_and_the_venv_package():
    commands = {"tmux": "tmux", "ip": "iproute2", "ss": "iproute2", "rsync": "rsync"}
    found = {"tmux": "/usr/bin/tmux", "ip": None, "ss": None, "rsync": "/usr/bin/rsync"}
    assert prereqs.missing(found, commands, True, "python3", "python3-venv") == (["ip", "ss"], ["iproute2"])
    assert prereqs.missing(found, commands, False, "python3", "python3-venv") == (
        ["ip", "ss", "python3 -m venv"], ["iproute2", "python3-venv"])


def test_the_probe_runs_alone_as_the_program_on_stdin(tmp_path):
    # as roles/node_prereqs runs it: `python3 - ARGS` with the file on stdin, no package on sys.path
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tool-here").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "tool-here").chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-", "--path", str(tmp_path / "bin"), "--python", sys.executable,
         "--command", "tool-here=pkg-a", "--command", "tool-gone=pkg-b"],
        input=(REPO / "nodeprobe" / "prereqs.py").read_text(), capture_output=True, text=True, cwd=tmp_path,
        check=True)
    got = json.loads(out.stdout)
    assert got["system"] == "Linux"
    assert got["found"] == {"tool-here": str(tmp_path / "bin" / "tool-here"), "tool-gone": None}
    assert got["missing_cmds"] == ["tool-gone"] and got["missing_pkgs"] == ["pkg-b"]
    assert got["os_family"] == "Debian"  # this machine runs Debian 12


def test_a_lab_folder_that_ddplab_did_not_make_is_refused(tmp_path):
    home = tmp_path / "home"
    (home / "thesis").mkdir(parents=True)
    (home / "thesis" / "chapter1.tex").write_text("words")
    assert prereqs.root_problem("/", str(home)) == "is /"
    assert prereqs.root_problem(str(home), str(home)) == "is your home folder"
    assert prereqs.root_problem(str(home) + "/", str(home)) == "is your home folder"
    assert "ddplab did not make it" in prereqs.root_problem(str(home / "thesis"), str(home))
    (home / "notes.txt").write_text("x")
    assert prereqs.root_problem(str(home / "notes.txt"), str(home)) == "is not a folder"
    assert prereqs.root_problem(str(home / "new"), str(home)) is None  # made by ddplab
    (home / "empty").mkdir()
    assert prereqs.root_problem(str(home / "empty"), str(home)) is None
    (home / "thesis" / prereqs.ROOT_MARKER).write_text("")
    assert prereqs.root_problem(str(home / "thesis"), str(home)) is None  # marked: ddplab made it
    (home / "old" / "code").mkdir(parents=True)
    (home / "old" / "code" / ".ddplab-code-files.json").write_text("{}")
    assert prereqs.root_problem(str(home / "old"), str(home)) is None  # a lab from before the marker
