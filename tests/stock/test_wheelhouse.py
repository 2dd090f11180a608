"""ddplab/wheelhouse.py: which wheels a node installs, the manifest, and bad input (pure logic)."""

from __future__ import annotations

import json

import pytest

from ddplab import wheelhouse as wh

FILES = [
    "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
    "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",
    "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_aarch64.whl",
    "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    "markupsafe-3.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
    "pyarrow-26.0.1-cp312-cp312-manylinux_2_28_x86_64.whl",
    "sympy-1.14.0-py3-none-any.whl",
    "README.txt",
]


def manifest():
    files = [{"file": f, "size": 10 + i, "sha256": "0" * 64} for i, f in enumerate(FILES)]
    return {"torch": "2.13.0", "files": files}


def names(sel):
    return [f["file"] for f in sel["files"]]


def test_a_debian12_node_takes_its_python_and_machine_only():
    sel = wh.select(manifest(), "3.11", "x86_64", "2.36")
    assert names(sel) == [FILES[0], FILES[3], FILES[4], FILES[6]]
    assert sel["torch"] == FILES[0] and sel["bytes"] == 10 + 13 + 14 + 16


def test_python_312_and_arm_nodes_get_theirs():
    assert names(wh.select(manifest(), "3.12", "x86_64", "2.39")) == [FILES[1], FILES[5], FILES[6]]
    assert wh.select(manifest(), "3.11", "aarch64", "2.36")["torch"] == FILES[2]


def test_an_old_glibc_or_missing_python_finds_no_torch():
    assert wh.select(manifest(), "3.11", "x86_64", "2.27")["torch"] is None  # manylinux_2_28 needs glibc 2.28
    assert wh.select(manifest(), "3.13", "x86_64", "2.36")["torch"] is None


@pytest.mark.parametrize("python,glibc,what", [("3", "2.36", "python version '3'"),
                                               ("3.11", "", "glibc version ''")])
def test_bad_versions_are_refused_with_one_message(tmp_path, capsys, python, glibc, what):
    (tmp_path / wh.MANIFEST).write_text(json.dumps(manifest()))
    rc = wh.main(["select", "--dir", str(tmp_path), "--python", python, "--machine", "x86_64",
                  "--glibc", glibc])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("ddplab: error: ") and what in err and "Traceback" not in err


def test_select_without_a_wheelhouse_says_make_wheelhouse(tmp_path, capsys):
    rc = wh.main(["select", "--dir", str(tmp_path), "--python", "3.11", "--machine", "x86_64",
                  "--glibc", "2.36"])
    assert rc == 2 and "fix: make wheelhouse" in capsys.readouterr().err


def test_manifest_lists_every_wheel_and_reuses_known_hashes(tmp_path):
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"abc")
    first = wh.write_manifest(tmp_path, "2.13.0")
    assert first["files"] == [{"file": "a-1.0-py3-none-any.whl", "size": 3,
                               "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}]
    (tmp_path / "b-1.0-py3-none-any.whl").write_bytes(b"")
    again = wh.write_manifest(tmp_path, "2.13.0")
    assert [f["file"] for f in again["files"]] == ["a-1.0-py3-none-any.whl", "b-1.0-py3-none-any.whl"]
    assert json.loads((tmp_path / wh.MANIFEST).read_text()) == again
