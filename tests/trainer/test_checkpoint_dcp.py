"""--shard's checkpoint folders count only whole: every file matches the manifest written last."""

from __future__ import annotations

from trainer import checkpoint_dcp


def folder(tmp_path, manifest=True):
    d = tmp_path / "ckpt" / "step_000004.dcp"
    d.mkdir(parents=True)
    for name, data in ((".metadata", b"meta"), ("__0_0.distcp", b"shard 0"), ("__1_0.distcp", b"shard 1"),
                       ("run.pt", b"run")):
        (d / name).write_bytes(data)
    if manifest:
        checkpoint_dcp._write_manifest(d)
    return d


def test_a_whole_folder_passes_and_is_listed(tmp_path):
    d = folder(tmp_path)
    assert checkpoint_dcp.manifest_problem(d) is None
    assert sorted(ln.split("  ")[1] for ln in (d / "MANIFEST.sha256").read_text().splitlines()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "run.pt"]
    (tmp_path / "ckpt" / ".step_000006.dcp.tmp-rank1").mkdir()  # a rank's staging folder is no checkpoint
    assert checkpoint_dcp.list_checkpoints(tmp_path) == [(4, d)]


def test_a_torn_missing_or_unfinished_folder_is_skipped_with_the_reason(tmp_path):
    d = folder(tmp_path)
    (d / "__1_0.distcp").write_bytes(b"shard")  # torn
    assert "__1_0.distcp is missing or its sha256 differs" in checkpoint_dcp.manifest_problem(d)
    (d / "__1_0.distcp").unlink()
    assert "__1_0.distcp is missing" in checkpoint_dcp.manifest_problem(d)
    assert "no MANIFEST.sha256" in checkpoint_dcp.manifest_problem(folder(tmp_path / "b", manifest=False))


def test_files_travel_in_pieces_of_at_most_16_mib():
    assert checkpoint_dcp._chunks(0) == []
    assert checkpoint_dcp._chunks(40 << 20) == [16 << 20, 16 << 20, 8 << 20]
