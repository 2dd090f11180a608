"""Content hashes of ddplab: files, code trees, shard sets (stdlib only, no package imports).

One module for every side: the control host plans a code sync with it (ddplab.code_tree), a node
hashes its copy with it (shipped alone by roles/code_sync: ``python hashing.py tree-lines DIR``; only
what a record says ddplab placed there, so a sync never prunes a file it did not place),
preflight's fingerprint and verdict compare with it, the dataset role verifies shards with it.

- ``sha256_file``: hex sha256 of one file.
- Tree hash (ONE format): the lines ``"<sha256>  <relative path>"`` of every file under a folder,
  sorted bytewise by path, minus ``EXCLUDE`` (bytecode, __pycache__, .git, .pytest_cache, the
  code folder's own .ddplab-code* records); the hash is sha256 of those lines, each ending in
  ``\\n`` (what ``sha256sum`` prints, so ``sha256sum`` can check it by hand).
  On a node, a synced tree counts only the files ddplab placed in it (``RECORD`` in the code folder,
  ``SYNC_RECORD`` in a ddplab_sync_dirs folder, both written by roles/code_sync): what the user's code
  writes there (checkpoints, ``out/``) is neither hashed nor pruned.
- Manifest digest (docs/contracts.md): sha256 of the sorted lines ``"<file> <sha256>\\n"``;
  ``verify_shards`` checks a data folder against a manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

CHUNK = 1 << 20
# In a node's code folder: {tree folder: [paths relative to it of the files ddplab placed]}.
RECORD = ".ddplab-code-files.json"
# In a ddplab_sync_dirs folder on a node: [paths relative to it of the files ddplab placed].
SYNC_RECORD = ".ddplab-sync-files.json"
# In the node's data folder: [the shards ddplab placed] (roles/dataset prunes by it, never by a glob).
SHARD_RECORD = ".ddplab-shard-files.json"
# Never synced and never hashed: rebuilt on the node (bytecode), tool state, the sync's own records.
EXCLUDE = re.compile(r"(^|/)(__pycache__|\.git|\.pytest_cache)(/|$)|\.py[co]$|^\.ddplab-(code|sync-files)")


# The stat cache: a file of at least CACHE_MIN_BYTES whose (device, inode, size, mtime, ctime) did not
# change since it was hashed is not read again (what git's index and rsync also trust). A relaunch then
# re-checks gigabytes of shards and synced data in milliseconds. A file changed within RACY_S seconds of
# its hashing is not cached (its next change could keep the same mtime). The trainer's own check at start
# reads every shard (use_cache=False): that is the proof; prepare and preflight ask "did anything change".
# DDPLAB_HASH_CACHE=<file> moves the cache, DDPLAB_HASH_CACHE=0 turns it off.
CACHE_MIN_BYTES = 256 << 10
RACY_S = 2.0
_cache: dict | None = None
_cache_dirty = False


def cache_path() -> str | None:
    env = os.environ.get("DDPLAB_HASH_CACHE")
    if env is not None:
        return None if env in ("", "0") else env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ddplab", "sha256-cache.json")


def _load_cache() -> dict:
    global _cache
    if _cache is None:
        _cache = {}
        path = cache_path()
        if path:
            try:
                with open(path) as f:
                    data = json.load(f)
                _cache = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                pass  # none yet, or unreadable: start empty
            import atexit

            atexit.register(flush_cache)
    return _cache


def flush_cache() -> None:
    """Write the cache (atomically) when it changed; entries of files that are gone are dropped."""
    global _cache_dirty
    path = cache_path()
    if not (_cache_dirty and path and _cache is not None):
        return
    keep = {k: v for k, v in _cache.items() if os.path.exists(k)}
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(keep, f)
        os.replace(tmp, path)
        _cache_dirty = False
    except OSError:
        pass  # a cache that cannot be written only costs the next run a re-read


def sha256_file(path, use_cache: bool = True) -> str:
    global _cache_dirty
    st = os.stat(path)
    key = stamp = None
    if use_cache and st.st_size >= CACHE_MIN_BYTES and cache_path():
        key = os.path.realpath(path)
        stamp = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        hit = _load_cache().get(key)
        if isinstance(hit, list) and len(hit) == 6 and hit[:5] == stamp:
            return hit[5]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    digest = h.hexdigest()
    if key is not None and time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > RACY_S:
        _load_cache()[key] = [*stamp, digest]
        _cache_dirty = True
    return digest


def excluded(rel: str) -> bool:
    return bool(EXCLUDE.search(rel))


def placed(root) -> dict[str, set[str]]:
    """The synced trees at or under ``root`` with the files ddplab placed in them, from the code folder's
    RECORD (in root, or in its parent when root is one tree): {tree prefix relative to root ("" when root
    is the tree): {root-relative paths}}; {} without a record (the control host, an older node). A sync
    dir's own SYNC_RECORD (or the data folder's SHARD_RECORD: a list) makes root one tree."""
    root = os.path.abspath(root)
    for name in (SYNC_RECORD, SHARD_RECORD):
        try:
            with open(os.path.join(root, name)) as f:
                files = json.load(f)
            if isinstance(files, list):
                return {"": set(map(str, files))}
        except (OSError, ValueError):
            pass
    for code_dir in (root, os.path.dirname(root)):
        try:
            with open(os.path.join(code_dir, RECORD)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        out = {}
        for tree, files in record.items() if isinstance(record, dict) else ():
            top = os.path.normpath(os.path.join(code_dir, tree))
            if top == root:
                out[""] = set(files)
            elif top.startswith(root + os.sep):
                prefix = os.path.relpath(top, root) + "/"
                out[prefix] = {prefix + f for f in files}
        return out
    return {}


def tree_files(root, placed_only: bool = False) -> list[str]:
    """Relative paths of the files under ``root`` that the tree hash covers, sorted bytewise.

    ``placed_only`` (a node's copy, which a sync may prune): only files a record says ddplab placed; no
    record, nothing. Otherwise (the control host's source) a record still hides what is not in it."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = [d for d in dirnames if not excluded(rel_dir + d + "/")]
        out += [rel_dir + n for n in filenames
                if not excluded(rel_dir + n) and os.path.isfile(os.path.join(dirpath, n))]
    trees = placed(root)
    if placed_only:
        out = [rel for rel in out if any(rel in files for files in trees.values())]
    elif trees:
        out = [rel for rel in out
               if all(rel in files for prefix, files in trees.items() if rel.startswith(prefix))]
    return sorted(out)  # code-point order of str == byte order of their UTF-8


def unplaced(root, rels) -> list[str]:
    """The paths among ``rels`` (relative to root) where something exists that ddplab did not place: a
    sync must not overwrite them."""
    mine = {rel for files in placed(root).values() for rel in files}
    return [rel for rel in rels if rel not in mine and os.path.lexists(os.path.join(root, rel))]


def tree_lines(root, rels=None, prefix: str = "") -> list[str]:
    """``"<sha256>  <prefix><rel>"`` for each file (``rels``: these files of root, else all)."""
    rels = tree_files(root) if rels is None else sorted(rels)
    return [f"{sha256_file(os.path.join(root, rel))}  {prefix}{rel}" for rel in rels]


def lines_digest(lines: list[str]) -> str:
    """The tree hash of these sum lines (they must be sorted by path)."""
    return hashlib.sha256("".join(ln + "\n" for ln in lines).encode()).hexdigest()


def tree_hash(root) -> dict:
    """``{"path", "files", "sha256"}`` of a code folder, or ``{"path", "error"}`` when it is none."""
    root = Path(root)
    if not root.is_dir():
        return {"path": str(root), "error": f"{root} is not a directory"}
    lines = tree_lines(root)
    return {"path": str(root), "files": len(lines), "sha256": lines_digest(lines)}


def set_digest(files: dict[str, str]) -> str:
    """The manifest digest of ``{file: sha256}``: sha256 of the sorted lines 'file sha256\\n'."""
    return hashlib.sha256("".join(f"{name} {files[name]}\n" for name in sorted(files)).encode()).hexdigest()


def manifest_digest(entries: list[dict]) -> str:
    """The manifest digest of manifest.json's ``files`` list (``[{"file", "sha256", ...}]``)."""
    return set_digest({str(e["file"]): str(e["sha256"]) for e in entries})


def manifest_files(manifest: dict) -> dict[str, str]:
    """{file: sha256} of a manifest.json object; raises ValueError when it has no usable 'files'."""
    entries = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(entries, list):
        raise ValueError("manifest has no 'files' list")
    out = {}
    for e in entries:
        if not isinstance(e, dict) or "file" not in e or "sha256" not in e:
            raise ValueError(f"manifest entry without file/sha256: {e!r}")
        if "/" in str(e["file"]) or str(e["file"]) in ("", ".", ".."):
            raise ValueError(f"manifest entry {e['file']!r} is not a plain file name")
        out[str(e["file"])] = str(e["sha256"])
    return out


def compare(actual: dict[str, str], expected: dict[str, str]) -> dict:
    """Names of files missing from / extra to / changed against ``expected``."""
    return {
        "missing": sorted(set(expected) - set(actual)),
        "extra": sorted(set(actual) - set(expected)),
        "changed": sorted(f for f in set(actual) & set(expected) if actual[f] != expected[f]),
    }


def load_manifest(path) -> tuple[dict | None, str | None]:
    """(manifest, None) or (None, error text)."""
    try:
        manifest = json.loads(Path(path).read_text())
        manifest_files(manifest)
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        return None, f"{path} is not a valid manifest: {e}"
    return manifest, None


def verify_shards(data_dir, manifest: dict) -> dict:
    """Hash the shards ``manifest`` names in ``data_dir`` (other ``*.parquet`` are listed as extra).

    ``ok`` is true when every named shard is there with its sha256 and no other shard is.
    """
    data_dir = Path(data_dir)
    expected = manifest_files(manifest)
    have = {}
    for name in expected:
        path = data_dir / name
        if path.is_file():
            have[name] = sha256_file(path)
    extra = sorted(p.name for p in data_dir.glob("*.parquet") if p.name not in expected) \
        if data_dir.is_dir() else []
    diff = compare(have, expected)
    diff["extra"] = extra
    try:  # the node's copy of the manifest: prepare rewrites it only when it differs
        manifest_same = json.loads((data_dir / "manifest.json").read_text()) == manifest
    except (OSError, ValueError):
        manifest_same = False
    return {"dir": str(data_dir), "ok": not any(diff.values()), **diff,
            "bad": diff["missing"] + diff["changed"], "files": have, "manifest_same": manifest_same}


def shard_set(data_dir) -> dict:
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


USAGE = ("usage: hashing.py tree-lines DIR | hashing.py tree-json DIR [REL...] | "
         "hashing.py unplaced DIR REL... | hashing.py verify-shards DIR MANIFEST")


def shards_verdict(data_dir, manifest_path) -> tuple[bool, str]:
    """(ok, one line) of ``data_dir`` against the manifest file: every shard read (no stat cache)."""
    manifest, err = load_manifest(manifest_path)
    if manifest is None:
        return False, err
    res = {name: sha256_file(Path(data_dir) / name, use_cache=False) for name in manifest_files(manifest)
           if (Path(data_dir) / name).is_file()}
    diff = compare(res, manifest_files(manifest))
    diff["extra"] = sorted(p.name for p in Path(data_dir).glob("*.parquet") if p.name not in res
                           and p.name not in diff["missing"]) if Path(data_dir).is_dir() else []
    if not any(diff.values()):
        return True, f"{len(res)} shards in {data_dir} match the manifest (digest {set_digest(res)[:16]})"
    parts = [f"{kind} {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
             for kind, names in diff.items() if names]
    return False, f"{data_dir} does not hold the manifest's shards: " + "; ".join(parts)


def main(argv=None) -> int:
    """On a node: ``tree-lines DIR`` prints the sum lines of the files ddplab placed in DIR (nothing when
    DIR or its record does not exist); ``tree-json DIR [REL...]`` prints the same lines (or those of the
    files REL) as one JSON list, so a file name with a newline stays one name for the reader; ``unplaced
    DIR REL...`` prints each REL that exists in DIR but was not placed by ddplab (what a sync would
    overwrite); ``verify-shards DIR MANIFEST`` hashes every shard
    the manifest file names in DIR and prints one line (exit 1 when a shard is missing, changed or extra):
    the data check of an exported sbatch job (ddplab/export_sbatch.py)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "tree-lines":
        if os.path.isdir(argv[1]):
            for line in tree_lines(argv[1], tree_files(argv[1], placed_only=True)):
                print(line)
        return 0
    if len(argv) >= 2 and argv[0] == "tree-json":
        rels = argv[2:] or (tree_files(argv[1], placed_only=True) if os.path.isdir(argv[1]) else [])
        print(json.dumps(tree_lines(argv[1], rels)))
        return 0
    if len(argv) == 3 and argv[0] == "verify-shards":
        ok, line = shards_verdict(argv[1], argv[2])
        print(line)
        return 0 if ok else 1
    if len(argv) >= 2 and argv[0] == "unplaced":
        for rel in unplaced(argv[1], argv[2:]):
            print(rel)
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
