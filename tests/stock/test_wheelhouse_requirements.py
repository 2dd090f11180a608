"""The user's requirements in the wheelhouse (ddplab/wheelhouse.py, ddplab/wheel_download.py): the record of
what they were downloaded for, which wheels a node takes, a changed file noticed, and real `pip download` /
`pip wheel` runs of tiny packages (PyPI is reachable from this machine)."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ddplab import wheelhouse as wh
from ddplab.wheel_download import WheelhouseError, download_requirements
from nodeprobe.hashing import sha256_file
from tests.helpers.wheels import pure_wheel

REPO = Path(__file__).resolve().parents[2]
SIX = "six-1.17.0-py2.py3-none-any.whl"
NUMPY = "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
NUMPY_312 = "numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"


def filled(tmp_path: Path, text: str = "six\nnumpy\n") -> tuple[Path, dict]:
    """A requirements file and a manifest recording its wheels for python 3.11 x86_64."""
    req = tmp_path / "requirements.txt"
    req.write_text(text)
    files = [{"file": f, "size": 100 + i, "sha256": "0" * 64} for i, f in enumerate((SIX, NUMPY, NUMPY_312))]
    record = {"file": str(req), "sha256": sha256_file(req), "torch": "2.13.0",
              "wheels": {"3.11 x86_64": [SIX, NUMPY]}}
    return req, {"torch": "2.13.0", "files": files, "requirements": record}


def test_a_node_takes_the_recorded_wheels_of_its_python_offline(tmp_path):
    req, manifest = filled(tmp_path)
    sel = wh.select_requirements(manifest, req, "3.11", "x86_64", "2.36")
    assert sel["offline"] is True and sel["warning"] == ""
    assert [f["file"] for f in sel["files"]] == [SIX, NUMPY] and sel["bytes"] == 100 + 101


def test_a_wheel_the_node_has_at_that_version_does_not_travel(tmp_path):
    req, manifest = filled(tmp_path)
    have = wh.node_installed(json.dumps([["NumPy", "2.4.6"], ["six", "1.16.0"]]))
    sel = wh.select_requirements(manifest, req, "3.11", "x86_64", "2.36", have)
    assert [f["file"] for f in sel["files"]] == [SIX] and sel["offline"] is True


def test_a_changed_file_goes_to_the_index_with_the_fix(tmp_path):
    req, manifest = filled(tmp_path)
    req.write_text("six\nnumpy\nrequests\n")
    sel = wh.select_requirements(manifest, req, "3.11", "x86_64", "2.36")
    assert sel["offline"] is False and sel["files"] == []
    assert f"{req} changed since make wheelhouse" in sel["warning"]
    assert "fix: make wheelhouse INV=<your inventory>" in sel["warning"]


def test_another_python_or_an_old_glibc_goes_to_the_index_with_the_fix(tmp_path):
    req, manifest = filled(tmp_path)
    other = wh.select_requirements(manifest, req, "3.12", "x86_64", "2.36")
    assert other["offline"] is False
    assert "for python 3.11 x86_64, not for this node's python 3.12 x86_64" in other["warning"]
    assert 'fix: make wheelhouse INV=<your inventory> (or PYTHONS="3.12")' in other["warning"]
    old = wh.select_requirements(manifest, req, "3.11", "x86_64", "2.17")  # numpy needs glibc 2.27
    assert old["offline"] is False and NUMPY in old["warning"] and SIX not in old["warning"]


def test_no_wheelhouse_or_no_requirement_wheels_name_the_file_and_the_fix(tmp_path):
    req, manifest = filled(tmp_path)
    del manifest["requirements"]
    sel = wh.select_requirements(manifest, req, "3.11", "x86_64", "2.36")
    assert sel["offline"] is False and sel["hashed"] == ""
    assert sel["warning"] == (f"the wheelhouse has no wheels of {req} (a node reads a package index "
                              "only with ddplab_pip_index_fallback=true); fix: make wheelhouse "
                              "INV=<your inventory>")
    argv = [sys.executable, "-m", "ddplab.wheelhouse", "select", "--dir", str(tmp_path / "none"), "--python",
            "3.11", "--machine", "x86_64", "--glibc", "2.36", "--requirements", str(req)]
    rc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert rc.returncode == 0 and json.loads(rc.stdout)["offline"] is False, rc.stderr
    assert f"no wheels of {req}" in json.loads(rc.stdout)["warning"]


def test_the_hashed_text_pins_every_recorded_wheel_by_version_and_sha256(tmp_path):
    req, manifest = filled(tmp_path)
    manifest["files"][0]["sha256"] = "a" * 64
    have = wh.node_installed(json.dumps([["six", "1.17.0"]]))  # installed: not pushed, still pinned
    sel = wh.select_requirements(manifest, req, "3.11", "x86_64", "2.36", have)
    assert [f["file"] for f in sel["files"]] == [NUMPY]
    assert sel["hashed"] == (f"numpy==2.4.6 --hash=sha256:{'0' * 64}\n"
                             f"six==1.17.0 --hash=sha256:{'a' * 64}\n")
    torch = wh.select({"torch": "2.13.0", "files": [
        {"file": "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "size": 1, "sha256": "b" * 64},
        {"file": "six-1.16.0-py2.py3-none-any.whl", "size": 1, "sha256": "c" * 64},
        {"file": SIX, "size": 1, "sha256": "d" * 64}]}, "3.11", "x86_64", "2.36")
    assert torch["hashed"] == (f"six==1.17.0 --hash=sha256:{'d' * 64}\n"  # an older fill's six: not pinned
                               f"torch==2.13.0+cpu --hash=sha256:{'b' * 64}\n")


@pytest.mark.slow  # two venvs and real pip installs (~10 s)
def test_a_planted_newer_wheel_in_the_nodes_wheelhouse_is_not_installed(tmp_path):
    """The node's pip as roles/torch_env runs it, in a real venv: the old command (--find-links and the
    requirements file) takes a newer wheel planted beside the manifest's; the new one (--require-hashes with
    select's text on stdin) installs the manifest's version only."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    good = pure_wheel(folder, "ddplab-plant-probe", "1.0")
    req = tmp_path / "requirements.txt"
    req.write_text("ddplab-plant-probe>=1.0\n")
    record = {"file": str(req), "sha256": sha256_file(req), "torch": "2.13.0",
              "wheels": {"3.11 x86_64": [good.name]}}
    manifest = wh.write_manifest(folder, "2.13.0", {}, record)
    pure_wheel(folder, "ddplab-plant-probe", "9.9", "PLANTED = True\n")  # after the fill: stale or planted
    sel = wh.select_requirements(manifest, req, "3.11", "x86_64", "2.36")
    assert sel["offline"] is True and sel["hashed"].startswith("ddplab-plant-probe==1.0 --hash=sha256:")

    def installed(venv: Path, *args: str, stdin: str = "") -> str:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
               "--disable-pip-version-check", "--no-index", "--find-links", str(folder)]
        proc = subprocess.run(pip + list(args), input=stdin, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        probe = [str(venv / "bin" / "python"), "-c", "import ddplab_plant_probe as p; print(p.VERSION)"]
        return subprocess.run(probe, capture_output=True, text=True, timeout=60, check=True).stdout.strip()

    assert installed(tmp_path / "old", "-r", str(req)) == "9.9"  # the old command: the planted wheel wins
    assert installed(tmp_path / "new", "--require-hashes", "-r", "/dev/stdin", stdin=sel["hashed"]) == "1.0"


@pytest.mark.slow  # two venvs (one with pip) and a real pip install (~10 s)
def test_the_nodes_venv_and_pip_do_not_import_the_folder_they_run_from(tmp_path):
    """roles/torch_env makes venvs and runs pip from the login folder (or the requirements' folder): a
    tokenize.py there (a user's module) must not stand in for the standard library's. The old argv
    (`python -m venv`; `python -m pip` in a venv with setuptools' distutils .pth, as Python 3.11's lab venv)
    imported it and stopped; pip_wheels' argv (`python -I -m`) does not."""
    path = REPO / "roles" / "torch_env" / "filter_plugins" / "pip_wheels.py"
    spec = importlib.util.spec_from_file_location("pip_wheels", path)
    pip_wheels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pip_wheels)
    login = tmp_path / "login"
    login.mkdir()
    (login / "tokenize.py").write_text("raise ImportError('a tokenize.py in the login folder')\n")

    def run(argv, stdin=""):
        return subprocess.run(argv, input=stdin, cwd=login, capture_output=True, text=True, timeout=300)

    old = run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "old")])
    assert old.returncode != 0 and "a tokenize.py in the login folder" in old.stderr, old.stderr
    lab = tmp_path / "venv"  # venv.yml's lab venv: pip (and on 3.11 setuptools) of its own
    made = run(pip_wheels.venv_create(sys.executable, str(lab), with_pip=True))
    assert made.returncode == 0, made.stderr
    python = str(lab / "bin" / "python")
    if list(lab.glob("lib/python3*/site-packages/distutils-precedence.pth")):
        old_pip = run([python, "-m", "pip", "--version"])
        assert old_pip.returncode != 0 and "a tokenize.py in the login folder" in old_pip.stderr, \
            old_pip.stderr
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    good = pure_wheel(wheels, "ddplab-plant-probe", "1.0")
    pip = run(pip_wheels.pip_install(python, "", wheelhouse=str(wheels)),
              f"ddplab-plant-probe==1.0 --hash=sha256:{sha256_file(good)}\n")
    assert pip.returncode == 0, pip.stderr
    probe = run([python, "-I", "-c", "import ddplab_plant_probe as p; print(p.VERSION)"])
    assert probe.stdout.strip() == "1.0", probe.stderr


def test_the_manifest_keeps_other_pythons_only_for_the_same_file(tmp_path):
    (tmp_path / SIX).write_bytes(b"six")
    first = {"file": "r.txt", "sha256": "a" * 64, "torch": "2.13.0", "wheels": {"3.11 x86_64": [SIX]}}
    wh.write_manifest(tmp_path, "2.13.0", {"3.11 x86_64": []}, first)
    same = {**first, "wheels": {"3.12 x86_64": [SIX]}}
    kept = wh.write_manifest(tmp_path, "2.13.0", {"3.12 x86_64": []}, same)
    assert kept["requirements"]["wheels"] == {"3.11 x86_64": [SIX], "3.12 x86_64": [SIX]}
    assert kept["torch_wheels"] == {"3.11 x86_64": [], "3.12 x86_64": []}
    changed = {**same, "sha256": "b" * 64}
    assert wh.write_manifest(tmp_path, "2.13.0", {}, changed)["requirements"]["wheels"] == same["wheels"]
    untouched = wh.write_manifest(tmp_path, "2.13.0")  # a fill without requirements keeps the record
    assert untouched["requirements"]["sha256"] == "b" * 64


def test_torch_select_leaves_out_the_wheels_only_the_requirements_took():
    torch = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    files = [{"file": n, "size": 1, "sha256": "0" * 64} for n in (torch, NUMPY, SIX)]
    manifest = {"torch": "2.13.0", "files": files}
    assert len(wh.select(manifest, "3.11", "x86_64", "2.36")["files"]) == 3  # no record: all that fit
    manifest["requirements"] = {"wheels": {"3.11 x86_64": [NUMPY, SIX]}}
    manifest["torch_wheels"] = {"3.11 x86_64": [torch, NUMPY]}  # numpy: both downloads took it
    assert [f["file"] for f in wh.select(manifest, "3.11", "x86_64", "2.36")["files"]] == [torch, NUMPY]


@pytest.mark.slow  # real pip / ansible runs
def test_pip_downloads_a_tiny_requirement_for_the_node_python(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.17.0\n")
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    assert download_requirements(folder, req, "3.12", "x86_64", "2.28", "2.13.0", "") == [SIX]
    assert (folder / SIX).is_file()
    # a second fill finds the wheel in place and records it again
    assert download_requirements(folder, req, "3.12", "x86_64", "2.28", "2.13.0", "") == [SIX]


def sdist(folder: Path, name: str, body: str) -> Path:
    """A source-only release of a one-module project (setuptools builds it)."""
    folder.mkdir(exist_ok=True)
    base = f"{name.replace('-', '_')}-1.0"
    files = {"pyproject.toml": f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                               f'"setuptools.build_meta"\n[project]\nname = "{name}"\nversion = "1.0"\n'
                               f'[tool.setuptools]\npy-modules = ["{name.replace("-", "_")}"]\n',
             f"{name.replace('-', '_')}.py": body,
             "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"}
    out = folder / f"{base}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{base}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


@pytest.mark.slow  # real pip / ansible runs
def test_a_source_only_package_is_built_into_a_wheel_on_the_control_host(tmp_path):
    sdist(tmp_path / "sdists", "ddplab-sdist-probe", "VALUE = 7\n")
    req = tmp_path / "requirements.txt"
    req.write_text("--find-links sdists\nddplab-sdist-probe==1.0\n")
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    wheels = download_requirements(folder, req, "3.11", "x86_64", "2.28", "2.13.0", "")
    assert wheels == ["ddplab_sdist_probe-1.0-py3-none-any.whl"] and (folder / wheels[0]).is_file()
    assert not list(folder.glob(".build-*"))  # the build folder is gone


@pytest.mark.slow  # real pip / ansible runs
def test_a_package_that_cannot_be_built_is_named_with_the_fix(tmp_path):
    broken = sdist(tmp_path / "sdists", "ddplab-broken-probe", "VALUE = 7\n")
    broken.write_bytes(b"not a tarball")
    req = tmp_path / "requirements.txt"
    req.write_text("--find-links sdists\nddplab-broken-probe==1.0\n")
    (tmp_path / "wheelhouse").mkdir()
    with pytest.raises(WheelhouseError) as e:
        download_requirements(tmp_path / "wheelhouse", req, "3.11", "x86_64", "2.28", "2.13.0", "")
    msg = str(e.value)
    assert "ddplab-broken-probe==1.0 has no wheel for python 3.11 x86_64" in msg and "fix:" in msg


def test_fill_refuses_a_requirement_on_another_torch_before_downloading(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("six\ntorch==2.1.0\n")
    proc = subprocess.run([sys.executable, "-m", "ddplab.wheelhouse", "fill", "--dir", str(tmp_path / "wh"),
                           "--requirements", str(req)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"ddplab: error: {req} line 2 asks for torch==2.1.0")
    assert not (tmp_path / "wh" / wh.MANIFEST).exists() and not list((tmp_path / "wh").glob("*.whl"))


@pytest.mark.slow  # real pip / ansible runs
def test_the_inventory_names_the_requirements_file(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("six\n")
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text("ddplab_nodes:\n  hosts:\n    n0: {ansible_host: 192.0.2.10}\n")
    (inv / "group_vars" / "all" / "ddplab.yml").write_text(
        'ddplab_code_dir: "{{ inventory_dir }}/../code"\nddplab_pip_requirements: requirements.txt\n')
    ansible = str(Path(sys.executable).with_name("ansible"))
    assert wh.inventory_requirements(str(inv), ansible).resolve() == code / "requirements.txt"
    (code / "requirements.txt").unlink()
    with pytest.raises(WheelhouseError, match="requirements.txt is not a file of ddplab_code_dir"):
        wh.inventory_requirements(str(inv), ansible)
