"""Shard folders: write `shard_XXXXX.parquet` + `manifest.json`, read them back, verify them.

Shards have one `text` column and a fixed number of rows per row group. `manifest.json` lists each
file's sha256, rows and row groups and a digest of the whole set (docs/contracts.md); the hashes are
nodeprobe's, so the trainer, the dataset role and preflight compute the same values.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from nodeprobe.hashing import set_digest, sha256_file
from trainer.config import UsageError
from trainer.data.corpus import read_source, synthetic_docs

MANIFEST = "manifest.json"
PREPARE_HINT = "python -m trainer.data prepare --out {d}"


def manifest_digest(files: list[dict]) -> str:
    """The digest of a manifest's file list (nodeprobe.hashing.set_digest of {file: sha256})."""
    return set_digest({f["file"]: f["sha256"] for f in files})


def write_shards(docs: list[str], out: Path, rows_per_group: int, groups_per_shard: int) -> dict:
    """Write shard_XXXXX.parquet + manifest.json into the (new, empty) folder `out`; return the manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n_groups = len(docs) // rows_per_group
    rows_per_shard = rows_per_group * groups_per_shard
    files = []
    for i, start in enumerate(range(0, n_groups * rows_per_group, rows_per_shard)):
        chunk = docs[start:min(start + rows_per_shard, n_groups * rows_per_group)]
        name = f"shard_{i:05d}.parquet"
        table = pa.table({"text": pa.array(chunk, type=pa.string())})
        pq.write_table(table, out / name, row_group_size=rows_per_group, compression="zstd")
        files.append({"file": name, "sha256": sha256_file(out / name), "rows": len(chunk),
                      "row_groups": len(chunk) // rows_per_group})
    manifest = {"version": 1, "rows_per_group": rows_per_group, "files": files,
                "digest": manifest_digest(files)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _is_shard_dir(d: Path) -> bool:
    return all(p.name == MANIFEST or (p.name.startswith("shard_") and p.suffix == ".parquet")
               for p in d.iterdir())


def prepare(out: Path, source: Path | None, docs: int | None, rows_per_group: int, groups_per_shard: int,
            seed: int) -> str:
    """Build shards in a temp folder next to `out`, then swap it in. Returns a one-line report."""
    if rows_per_group < 1 or groups_per_shard < 1:
        raise UsageError("--rows-per-group and --groups-per-shard must be at least 1")
    if docs is not None and docs < 1:
        raise UsageError(f"--docs must be at least 1, got {docs}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder; choose another path")
    if out.exists() and any(out.iterdir()) and not _is_shard_dir(out):
        raise UsageError(f"--out {out} is not empty and not a shard folder (files other than "
                         f"shard_*.parquet and {MANIFEST}); choose an empty or new folder")
    if source is not None:
        texts = read_source(source)
        random.Random(seed).shuffle(texts)
        texts = texts[:docs] if docs else texts
    else:
        texts = synthetic_docs(docs or 4096, seed)
    if len(texts) < rows_per_group:
        raise UsageError(f"only {len(texts)} documents, fewer than --rows-per-group {rows_per_group}; "
                         f"lower --rows-per-group or add documents")
    dropped = len(texts) % rows_per_group
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        manifest = write_shards(texts, tmp, rows_per_group, groups_per_shard)
        old = read_manifest(out) if (out / MANIFEST).exists() else None
        if old and old.get("digest") == manifest["digest"] and not verify(out):
            shutil.rmtree(tmp)
            return f"unchanged: {out} already holds digest {manifest['digest'][:16]}"
        if out.exists():
            trash = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, trash)
            os.rename(tmp, out)
            shutil.rmtree(trash)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    n_rg = sum(f["row_groups"] for f in manifest["files"])
    note = f" ({dropped} documents left over, fewer than a row group, not written)" if dropped else ""
    return (f"wrote {len(manifest['files'])} shards, {n_rg} row groups of {rows_per_group} rows to {out}, "
            f"digest {manifest['digest'][:16]}{note}")


# ----------------------------------------------------------------------------------------------
# reading + checking a shard folder


def read_manifest(d: Path) -> dict:
    try:
        m = json.loads((d / MANIFEST).read_text())
        assert isinstance(m, dict) and isinstance(m["files"], list) and m["rows_per_group"] >= 1
        for f in m["files"]:
            assert isinstance(f["file"], str) and "/" not in f["file"] and isinstance(f["sha256"], str)
            assert int(f["rows"]) >= 0 and int(f["row_groups"]) >= 0
        assert len({f["file"] for f in m["files"]}) == len(m["files"])  # the digest is over a set
        return m
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise UsageError(f"{d / MANIFEST} is unreadable or not a ddplab manifest; re-create the folder with "
                         f"`{PREPARE_HINT.format(d=d)}`") from None


def _check_folder(d: Path) -> dict:
    if not d.exists():
        raise UsageError(f"data folder {d} does not exist; create it with `{PREPARE_HINT.format(d=d)}`")
    if not d.is_dir():
        raise UsageError(f"data path {d} is not a folder; pass the folder made by "
                         f"`{PREPARE_HINT.format(d=d)}`")
    if not (d / MANIFEST).exists():
        if any(d.glob("*.parquet")):
            raise UsageError(f"data folder {d} has parquet files but no {MANIFEST}; convert them with "
                             f"`python -m trainer.data prepare --source {d} --out NEW_DIR`")
        raise UsageError(f"data folder {d} is empty (no {MANIFEST}); create it with "
                         f"`{PREPARE_HINT.format(d=d)}`")
    return read_manifest(d)


def _check_file(d: Path, f: dict, rows_per_group: int) -> str | None:
    """None when the shard matches its manifest entry, else what is wrong with it."""
    import pyarrow.parquet as pq

    p = d / f["file"]
    if not p.is_file():
        return f"{p} is missing"
    if sha256_file(p, use_cache=False) != f["sha256"]:  # the run's proof: every byte read, no stat cache
        return f"{p} is corrupt (sha256 differs from {MANIFEST})"
    try:
        meta = pq.ParquetFile(p).metadata
        names = meta.schema.to_arrow_schema().names
    except Exception as e:
        return f"{p} is not a readable parquet file ({type(e).__name__})"
    if "text" not in names:
        return f"{p} has no `text` column (columns: {', '.join(names)})"
    if meta.num_rows != int(f["rows"]) or meta.num_row_groups != int(f["row_groups"]):
        return f"{p} has {meta.num_rows} rows/{meta.num_row_groups} row groups, manifest says " \
               f"{f['rows']}/{f['row_groups']}"
    for i in range(meta.num_row_groups):
        if meta.row_group(i).num_rows != rows_per_group:
            return f"{p} row group {i} has {meta.row_group(i).num_rows} rows, not {rows_per_group}"
    return None


def verify(d: Path) -> list[str]:
    """Problems with a shard folder (empty list: every file matches the manifest, no stray parquet)."""
    try:
        m = _check_folder(d)
    except UsageError as e:
        return [str(e)]
    problems = [p for f in m["files"] if (p := _check_file(d, f, m["rows_per_group"]))]
    listed = {f["file"] for f in m["files"]}
    problems += [f"{p} is not listed in {MANIFEST}" for p in sorted(d.glob("*.parquet"))
                 if p.name not in listed]
    if m.get("digest") != manifest_digest(m["files"]):
        problems.append(f"{d / MANIFEST} digest does not match its file list")
    return problems


@dataclass
class Dataset:
    """A checked shard folder: (file, local row group) for every global row group index."""

    root: Path
    manifest: dict
    row_groups: list[tuple[str, int]]

    @property
    def digest(self) -> str:
        return self.manifest["digest"]

    @property
    def files(self) -> dict[str, str]:
        return {f["file"]: f["sha256"] for f in self.manifest["files"]}


def open_dataset(d: str | Path) -> Dataset:
    """Open a shard folder for training; every listed file is checked (sha256, schema, row groups)."""
    d = Path(d)
    m = _check_folder(d)
    for f in m["files"]:
        problem = _check_file(d, f, m["rows_per_group"])
        if problem:
            raise UsageError(f"{problem}; re-run `{PREPARE_HINT.format(d=d)}` or copy the shards again "
                             f"from the master node")
    if m.get("digest") != manifest_digest(m["files"]):
        raise UsageError(f"{d / MANIFEST} digest does not match its file list; re-create it with "
                         f"`{PREPARE_HINT.format(d=d)}`")
    rgs = [(f["file"], i) for f in m["files"] for i in range(int(f["row_groups"]))]
    if not rgs:
        raise UsageError(f"data folder {d} has no row groups; re-create it with more --docs")
    return Dataset(d, m, rgs)
