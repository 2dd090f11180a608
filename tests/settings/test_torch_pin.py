"""The torch pin: the control host's own torch is known good; else the wheel folder or the index is asked."""

import os
from importlib import metadata

import pytest
from settings_helpers import inventory, lines, shards  # noqa: F401

from ddplab.settings import external


@pytest.fixture
def no_pip_config(monkeypatch):
    """pip sees only the sources ddplab passes: no pip.conf, PIP_* variables or CPU index of this machine."""
    monkeypatch.setattr(external, "CPU_INDEX", "")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    for name in [n for n in os.environ if n.startswith("PIP_") and n != "PIP_CONFIG_FILE"]:
        monkeypatch.delenv(name)


@pytest.fixture
def offline_index(tmp_path, no_pip_config):
    """A PEP 503 index in a folder (file://) offering torch 2.14.0 and 2.15.0 only."""
    page = tmp_path / "index" / "torch"
    page.mkdir(parents=True)
    links = "".join(f'<a href="torch-{v}-cp311-cp311-manylinux_2_28_x86_64.whl">torch-{v}</a>\n'
                    for v in ("2.14.0", "2.15.0"))
    (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return (tmp_path / "index").as_uri()


def pin(shards, version, **kw):  # noqa: F811
    return lines(inventory(shards, ddplab_torch_version=version, **kw), network=True)


def test_control_hosts_torch_is_known_good_without_asking(shards, monkeypatch):  # noqa: F811
    monkeypatch.setattr(external, "pip_versions", lambda *a: pytest.fail("pip was asked"))
    assert pin(shards, metadata.version("torch").split("+")[0]) == []
    assert external.control_torch() == metadata.version("torch")


def test_index_without_the_version(shards, offline_index):  # noqa: F811
    out = pin(shards, "2.99.0", ddplab_pip_index_url=offline_index)
    assert len(out) == 1
    assert out[0].startswith("ddplab: error: ddplab_torch_version (all): 2.99.0 is not offered by")
    assert "one of its versions (2.15.0, 2.14.0, ...)" in out[0]
    assert pin(shards, "2.14.0", ddplab_pip_index_url=offline_index) == []


def test_unreachable_index_is_a_warning(shards, no_pip_config):  # noqa: F811
    out = pin(shards, "2.99.0", ddplab_pip_index_url="http://127.0.0.1:9/simple")
    assert len(out) == 1, out
    assert out[0].startswith("ddplab: warning: ddplab_torch_version (all): 2.99.0 could not be checked"), out


def test_wheel_folder(shards, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(external, "pip_versions", lambda *a: pytest.fail("pip was asked"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.99.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    (wheels / "numpy-2.0.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    assert pin(shards, "2.99.0", ddplab_pip_find_links=str(wheels)) == []
    out = pin(shards, "2.98.0", ddplab_pip_find_links=str(wheels))
    assert out == [f"ddplab: error: ddplab_torch_version (all): 2.98.0 has no wheel in {wheels} (it has "
                   f"2.99.0+cpu); a torch version of the configured wheel folder; set ddplab_torch_version "
                   f"to a version that exists there (this control host runs {external._installed()})"]
