"""The docs' nanochat checkout (docs/your-code.md, "nanochat from its checkout"), made as a reader makes it:
the section's commands, a user's clone of the vendored commit (tests/byo/fixtures/nanochat) with its data and
the requirements file, the section's inventory block, a wheelhouse and the control host's venv for nanochat's
tools. One home for tests/byo/test_nanochat_simlan.py (which asserts each command is in the section) and the
nanochat benches (bench/nanochat_compile.py, nanochat_rounds.py, nanochat_compile_race.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddplab.wheelhouse import DEFAULT_TORCH  # noqa: E402
from tests.byo.fixtures.nanochat.make_data import write_base_data  # noqa: E402  (the fixture's data, no test)

FIXTURE = REPO / "tests" / "byo" / "fixtures" / "nanochat"
SHARED_WHEELHOUSE = REPO / "wheelhouse"

# The section's commands for the checkout, as typed; <ddplab> is this repository.
APPLY = "git apply <ddplab>/tests/byo/fixtures/nanochat/gloo.patch"
DOWNLOAD = "NANOCHAT_BASE_DIR=base_dir python -m nanochat.dataset -n 2"  # stood in for by make_data.py
TOK_TRAIN = "NANOCHAT_BASE_DIR=base_dir python -m scripts.tok_train"
EXCLUDE = "echo base_dir/ >> .git/info/exclude"
REQUIREMENTS = ("<ddplab>/tests/byo/fixtures/nanochat/requirements.txt", "requirements-ddplab.txt")
CODE_DIR_LINE = "ddplab_code_dir: /home/me/src/nanochat"


def smallest_args(iterations: int) -> list[str]:
    """nanochat's smallest run that compiles what d4 compiles (the same torch.compile calls, fewer and
    smaller kernels): 2 ranks x 64 tokens a step, no evaluation during training, no sampling or CORE
    metric."""
    return ["--device-type=cpu", "--depth=1", "--max-seq-len=64", "--window-pattern=L",
            "--device-batch-size=1", "--total-batch-size=128", f"--num-iterations={iterations}",
            "--eval-every=-1", "--eval-tokens=128", "--core-metric-every=-1", "--sample-every=-1"]


def readme_section() -> str:
    """The section of the docs page the README links for your own code (docs/your-code.md)."""
    text = (REPO / "docs" / "your-code.md").read_text()
    return re.search(r"### nanochat from its checkout\n(.*?)(?:\n##|\Z)", text, re.S).group(1)


def readme_yaml() -> str:
    return re.search(r"```yaml\n(.*?)```", readme_section(), re.S).group(1)


def docs_code_yml(code: Path) -> str:
    """The section's inventory block with ddplab_code_dir pointing at the checkout (the one line a reader
    changes)."""
    block = readme_yaml()
    assert block.count(CODE_DIR_LINE) == 1, f"{CODE_DIR_LINE!r} is not once in docs/your-code.md's block"
    return block.replace(CODE_DIR_LINE, f"ddplab_code_dir: {code}")


def ddplab_path(command: str) -> str:
    return command.replace("<ddplab>", str(REPO))


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), "-c", "user.name=me", "-c", "user.email=me@example.org",
                           *args], check=True, capture_output=True, text=True, timeout=60).stdout.strip()


def shell(cmd: str, cwd: Path, path_first: Path | None = None, timeout: float = 300):
    """A command line as the user types it in the checkout (bash), with a venv's bin first on PATH."""
    env = dict(os.environ)
    if path_first is not None:
        env["PATH"] = f"{path_first}:{env['PATH']}"
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc


def user_clone(root: Path) -> Path:
    """root/nanochat: a user's clone of the vendored commit, its data and the requirements file the docs
    copy in."""
    code = root / "nanochat"
    code.mkdir(parents=True)
    # nanochat's own files (the fixture's others are ddplab's)
    shutil.copy2(FIXTURE / "LICENSE", code / "LICENSE")
    for folder in ("nanochat", "scripts"):
        shutil.copytree(FIXTURE / folder, code / folder, ignore=shutil.ignore_patterns("__pycache__"))
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-qm", "nanochat 92d63d4")
    write_base_data(code / "base_dir")  # DOWNLOAD's stand-in: no route to nanochat's data host here
    shutil.copy(ddplab_path(REQUIREMENTS[0]), code / REQUIREMENTS[1])  # the README's "copy ... to ..."
    return code


def user_inventory(root: Path, cluster, code: Path) -> Path:
    """root/mylab: the simulated lab's hosts and connection settings, and code.yml the section's block for
    the checkout."""
    inventory = root / "mylab"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    shutil.copy(cluster.inventory_dir / "hosts.yml", inventory / "hosts.yml")
    shutil.copy(cluster.inventory_dir / "group_vars" / "all" / "simlan.yml", inventory / "group_vars" / "all")
    (inventory / "group_vars" / "all" / "code.yml").write_text(docs_code_yml(code))
    return inventory


def fill_wheelhouse(folder: Path, *source: str, python: str = "3.11") -> None:
    """`make wheelhouse` into a folder of the caller's own for `source` (`-i INVENTORY` or `--requirements
    FILE`): the shared folder's wheels (torch) hard-linked first, so only the requirements' wheels (~30 MB)
    are downloaded."""
    folder.mkdir()
    for wheel in SHARED_WHEELHOUSE.glob("*.whl"):
        os.link(wheel, folder / wheel.name)
    argv = [sys.executable, "-m", "ddplab.wheelhouse", "fill", "--dir", str(folder), "--python", python,
            *source]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def control_venv(folder: Path, wheelhouse: Path, requirements: Path) -> Path:
    """The control host's interpreter for nanochat's tools: a venv on the dev venv's torch (a .pth, as
    roles/torch_env lays the nodes' code venv on the pinned Python), the requirements installed offline."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    base = subprocess.run([sys.executable, "-c", "import site; print(site.getsitepackages()[0])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout
    (next(folder.glob("lib/python3*/site-packages")) / "ddplab-base.pth").write_text(base)
    pin = folder / "constraints.txt"
    pin.write_text(f"torch=={DEFAULT_TORCH}\n")
    subprocess.run([folder / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-index", "--find-links", str(wheelhouse), "-r", str(requirements), "-c", str(pin)],
                   check=True, capture_output=True, timeout=600)
    return folder / "bin"
