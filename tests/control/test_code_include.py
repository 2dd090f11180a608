"""ddplab/code_include.py: git-ignored files shipped by glob, and the globs refused."""

import pytest

from ddplab import code_tree
from ddplab.code_include import included_files
from ddplab.errors import DdplabError


def make(tmp_path):
    for rel in ("data/shakespeare/train.bin", "data/shakespeare/val.bin", "data/shakespeare/meta.pkl",
                "data/other/deep/x.bin", "tok/tokenizer.json", "train.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    (tmp_path / "data" / "emptydir.bin").mkdir()
    return tmp_path


def test_globs_match_files_recursively_and_only_files(tmp_path):
    src = make(tmp_path)
    got = included_files(str(src), ["data/**/*.bin", "data/shakespeare/meta.pkl", "tok/*"])
    assert got == ["data/other/deep/x.bin", "data/shakespeare/meta.pkl", "data/shakespeare/train.bin",
                   "data/shakespeare/val.bin", "tok/tokenizer.json"]


@pytest.mark.parametrize("bad", ["/etc/passwd", "../secret/*", "data/../../x", ""])
def test_globs_outside_the_folder_are_refused(tmp_path, bad):
    with pytest.raises(DdplabError, match="is not a glob relative to ddplab_code_dir"):
        included_files(str(make(tmp_path)), [bad])


def test_a_glob_matching_nothing_is_refused(tmp_path):
    with pytest.raises(DdplabError, match=r"'data/\*\*/\*\.npy' matches no file"):
        included_files(str(make(tmp_path)), ["data/**/*.npy"])


def test_a_symlink_out_of_the_folder_is_refused_by_the_plan_not_dropped(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"y")
    src = make(tmp_path / "code")
    (src / "data" / "link.bin").symlink_to(outside / "big.bin")
    assert "data/link.bin" in included_files(str(src), ["data/**/*.bin"])
    with pytest.raises(DdplabError, match=f"{src}/data/link.bin is a link to {outside}/big.bin, outside"):
        code_tree.plan([{"src": str(src), "dest": "user", "mode": "all", "include": ["data/**/*.bin"]}])
