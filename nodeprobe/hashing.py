"""Content hashes shared by the node probes and the control-side verdict (stdlib only).

- ``tree_hash``: a code folder's version = sha256 over its sorted relative paths and file bytes,
  ``__pycache__`` and ``*.pyc`` ignored, so two nodes with the same code agree whatever the mtimes.
- ``shard_set``: the ``*.parquet`` files of a data folder with their sha256, the digest of that set
  computed as the manifest's ``digest`` is (docs/contracts.md), and a comparison with a manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def tree_hash(root: Path) -> dict:
    """sha256 of a code folder: for each file in sorted relative-path order, path, NUL, bytes, NUL."""
    root = Path(root)
    if not root.is_dir():
        return {"path": str(root), "error": f"{root} is not a directory"}
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                continue
            files.append(os.path.relpath(os.path.join(dirpath, name), root))
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0")
        with open(root / rel, "rb") as f:
            while block := f.read(CHUNK):
                h.update(block)
        h.update(b"\0")
    return {"path": str(root), "files": len(files), "sha256": h.hexdigest()}


def set_digest(files: dict[str, str]) -> str:
    """The manifest digest: sha256 of the sorted lines 'file sha256\\n'."""
    lines = "".join(f"{name} {files[name]}\n" for name in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def manifest_files(manifest: dict) -> dict[str, str]:
    """{file: sha256} of a manifest.json object; raises ValueError when it has no usable 'files'."""
    entries = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(entries, list):
        raise ValueError("manifest has no 'files' list")
    out = {}
    for e in entries:
        if not isinstance(e, dict) or "file" not in e or "sha256" not in e:
            raise ValueError(f"manifest entry without file/sha256: {e!r}")
        out[str(e["file"])] = str(e["sha256"])
    return out


def compare(actual: dict[str, str], expected: dict[str, str]) -> dict:
    """Names of files missing from / extra to / changed against ``expected``."""
    return {
        "missing": sorted(set(expected) - set(actual)),
        "extra": sorted(set(actual) - set(expected)),
        "changed": sorted(f for f in set(actual) & set(expected) if actual[f] != expected[f]),
    }


def load_manifest(path: Path) -> tuple[dict | None, str | None]:
    """(manifest, None) or (None, error text)."""
    try:
        manifest = json.loads(Path(path).read_text())
        manifest_files(manifest)
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        return None, f"{path} is not a valid manifest: {e}"
    return manifest, None


def shard_set(data_dir: Path) -> dict:
    """Hash every *.parquet in ``data_dir`` and compare with the folder's own manifest.json."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        return {"dir": str(data_dir), "error": f"data folder {data_dir} does not exist"}
    files = {p.name: sha256_file(p) for p in sorted(data_dir.glob("*.parquet")) if p.is_file()}
    out = {
        "dir": str(data_dir),
        "files": files,
        "count": len(files),
        "bytes": sum((data_dir / f).stat().st_size for f in files),
        "digest": set_digest(files),
    }
    manifest, err = load_manifest(data_dir / "manifest.json")
    if manifest is None:
        out["manifest_error"] = err
    else:
        expected = manifest_files(manifest)
        out["manifest_digest"] = manifest.get("digest")
        out["manifest_digest_ok"] = manifest.get("digest") == set_digest(expected)
        out["vs_manifest"] = compare(files, expected)
    return out
