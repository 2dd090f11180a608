"""Data: parquet shards (nanochat's format) + manifest, a byte-level tokenizer, and a resumable loader.

    python -m trainer.data prepare --out DIR [--source SRC] [--docs N] [--rows-per-group R] [--seed S]
    python -m trainer.data verify DIR

Shards have one `text` column and a fixed number of rows per row group. `manifest.json` lists each
file's sha256, rows and row groups and a digest of the whole set (docs/contracts.md). Ranks read row
groups strided by rank (rank, rank+world, ...), so their samples are disjoint and together complete.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.config import UsageError

BOS = 256  # document separator; bytes are 0..255
VOCAB_SIZE = 257
MANIFEST = "manifest.json"
PREPARE_HINT = "python -m trainer.data prepare --out {d}"


# ----------------------------------------------------------------------------------------------
# tokenizer


def encode(text: str) -> np.ndarray:
    """BOS + the UTF-8 bytes of `text`, as int64 token ids."""
    b = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    out = np.empty(len(b) + 1, dtype=np.int64)
    out[0] = BOS
    out[1:] = b
    return out


def decode(tokens) -> str:
    return bytes(int(t) for t in tokens if t < 256).decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------------
# built-in corpus: deterministic, English-like, with learnable structure (stories, facts, sums)

_NAMES = ["Ada", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jade", "Kai", "Lena", "Milo",
          "Nora", "Omar", "Pia", "Rosa", "Sam", "Tara", "Ugo", "Vera", "Wes", "Yara", "Zoe"]
_ANIMALS = ["cat", "dog", "fox", "owl", "horse", "goat", "duck", "frog", "mouse", "bear", "crow", "fish"]
_COLORS = ["red", "blue", "green", "black", "white", "brown", "gray", "yellow"]
_ADJS = ["small", "big", "quiet", "happy", "old", "young", "clever", "lazy", "brave", "shy"]
_PLACES = ["market", "river", "forest", "school", "garden", "harbor", "library", "hill", "station", "farm"]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_VERBS = ["walk", "play", "read", "sing", "swim", "run", "cook", "draw"]
_FOODS = ["bread", "apples", "soup", "cheese", "rice", "honey", "plums", "fish"]
_CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo", "Egypt": "Cairo",
             "Peru": "Lima", "Kenya": "Nairobi", "Chile": "Santiago", "Norway": "Oslo", "Cuba": "Havana"}


def _story(r: random.Random) -> str:
    name, animal = r.choice(_NAMES), r.choice(_ANIMALS)
    color, adj = r.choice(_COLORS), r.choice(_ADJS)
    out = [f"{name} has a {adj} {color} {animal}."]
    for _ in range(r.randint(3, 9)):
        kind = r.randrange(7)
        if kind == 0:
            out.append(f"On {r.choice(_DAYS)}, {name} went to the {r.choice(_PLACES)} with the {animal}.")
        elif kind == 1:
            out.append(f"The {animal} is {color} and {r.choice(_ADJS)}.")
        elif kind == 2:
            out.append(f"{name} likes to {r.choice(_VERBS)} and the {animal} likes to {r.choice(_VERBS)}.")
        elif kind == 3:
            a, b = r.randint(0, 9), r.randint(0, 9)
            out.append(f"{name} counted {a} plus {b}, which is {a + b}.")
        elif kind == 4:
            country = r.choice(sorted(_CAPITALS))
            out.append(f"The capital of {country} is {_CAPITALS[country]}.")
        elif kind == 5:
            out.append(f"At the {r.choice(_PLACES)}, {name} bought {r.choice(_FOODS)} for the {animal}.")
        else:
            friend = r.choice(_NAMES)
            out.append(f"{friend} asked {name}: \"Where is your {animal}?\" {name} said: \"At the "
                       f"{r.choice(_PLACES)}.\"")
    return " ".join(out)


def synthetic_docs(n: int, seed: int = 0) -> list[str]:
    r = random.Random(seed)
    return [_story(r) for _ in range(n)]


# ----------------------------------------------------------------------------------------------
# reading a source folder


def read_source(src: Path) -> list[str]:
    """Documents from every .txt (paragraphs), .jsonl (`text` field) and .parquet (`text` column)."""
    import pyarrow.parquet as pq

    if not src.is_dir():
        raise UsageError(f"--source {src} is not a folder; give a folder of .txt/.jsonl/.parquet files")
    docs: list[str] = []
    files = sorted(p for p in src.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.parts))
    for p in files:
        if p.suffix == ".txt":
            text = p.read_text(encoding="utf-8", errors="replace")
            docs.extend(s.strip() for s in text.replace("\r\n", "\n").split("\n\n") if s.strip())
        elif p.suffix == ".jsonl":
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise UsageError(f"{p}:{i} is not valid JSON ({e.msg}); fix or remove that line") \
                        from None
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise UsageError(f"{p}:{i} has no string field \"text\"; each line must be "
                                     f"{{\"text\": \"...\"}}")
                docs.append(obj["text"])
        elif p.suffix == ".parquet":
            try:
                schema = pq.read_schema(p)
            except Exception as e:
                raise UsageError(f"{p} is not a readable parquet file ({e}); remove or replace it") from None
            if "text" not in schema.names:
                raise UsageError(f"{p} has no `text` column (columns: {', '.join(schema.names)}); "
                                 f"rename the text column to `text` or remove the file")
            docs.extend(t for t in pq.read_table(p, columns=["text"]).column(0).to_pylist() if t)
    if not docs:
        raise UsageError(f"--source {src} holds no documents (.txt, .jsonl or .parquet with `text`)")
    return docs


# ----------------------------------------------------------------------------------------------
# writing shards + manifest


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest_digest(files: list[dict]) -> str:
    lines = sorted(f"{f['file']} {f['sha256']}\n" for f in files)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


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
        old = _read_manifest(out) if (out / MANIFEST).exists() else None
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


def _read_manifest(d: Path) -> dict:
    try:
        m = json.loads((d / MANIFEST).read_text())
        assert isinstance(m, dict) and isinstance(m["files"], list) and m["rows_per_group"] >= 1
        for f in m["files"]:
            assert isinstance(f["file"], str) and "/" not in f["file"] and isinstance(f["sha256"], str)
            assert int(f["rows"]) >= 0 and int(f["row_groups"]) >= 0
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
    return _read_manifest(d)


def _check_file(d: Path, f: dict, rows_per_group: int) -> str | None:
    """None when the shard matches its manifest entry, else what is wrong with it."""
    import pyarrow.parquet as pq

    p = d / f["file"]
    if not p.is_file():
        return f"{p} is missing"
    if sha256_file(p) != f["sha256"]:
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


# ----------------------------------------------------------------------------------------------
# the loader


class ShardLoader:
    """Batches of (x, y) token ids for one rank, from row groups rank, rank+world, ...

    Each batch takes B*T+1 consecutive tokens of this rank's stream (x = first B*T, y = shifted by one);
    the next batch starts at the last token of this one. The position of the next unread token,
    (epoch, k = index into this rank's row groups, row, token), is the resumable state.
    """

    def __init__(self, ds: Dataset, rank: int, world_size: int, batch_size: int, seq_len: int,
                 state: dict | None = None):
        n = len(ds.row_groups)
        if world_size > n:
            raise UsageError(f"the data has {n} row groups but the world size is {world_size}, so some "
                             f"ranks would get no data; prepare more data or a smaller --rows-per-group "
                             f"(at least {world_size} row groups)")
        self.ds, self.rank, self.world = ds, rank, world_size
        self.B, self.T = batch_size, seq_len
        self.my_rgs = list(range(rank, n, world_size))
        self.epoch = self.k = self.row = self.tok = 0
        self.seen: set[int] = set()
        self._cache: dict[int, list[np.ndarray]] = {}
        self._files: dict = {}
        if state:
            self.load_state_dict(state)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "k": self.k, "row": self.row, "tok": self.tok, "rank": self.rank,
                "world_size": self.world}

    def load_state_dict(self, s: dict):
        if s["world_size"] != self.world or s["rank"] != self.rank:
            raise UsageError(f"checkpoint data position is for rank {s['rank']} of {s['world_size']}, this "
                             f"is rank {self.rank} of {self.world}; resume with the same number of ranks")
        self.epoch, self.k, self.row, self.tok = s["epoch"], s["k"], s["row"], s["tok"]

    @property
    def row_group(self) -> int:
        """Global index of the row group the next batch starts in."""
        return self.my_rgs[self.k]

    def _docs(self, k: int) -> list[np.ndarray]:
        if k not in self._cache:
            import pyarrow.parquet as pq

            fname, local = self.ds.row_groups[self.my_rgs[k]]
            if fname not in self._files:
                self._files[fname] = pq.ParquetFile(self.ds.root / fname)
            texts = self._files[fname].read_row_group(local, columns=["text"]).column(0).to_pylist()
            if len(self._cache) > 2:
                self._cache.clear()
            self._cache[k] = [encode(t or "") for t in texts]
            self.seen.add(self.my_rgs[k])
        return self._cache[k]

    def _walk(self, epoch, k, row, tok):
        """Yield (array slice, position after it) from a position onwards, forever (epochs wrap)."""
        while True:
            docs = self._docs(k)
            while row < len(docs):
                yield docs[row][tok:], (epoch, k, row + 1, 0)
                row, tok = row + 1, 0
            k, row = k + 1, 0
            if k == len(self.my_rgs):
                epoch, k = epoch + 1, 0

    def next_batch(self):
        import torch

        need, step = self.B * self.T + 1, self.B * self.T
        parts, have, new_pos = [], 0, None
        pos = (self.epoch, self.k, self.row, self.tok)
        for arr, after in self._walk(*pos):
            if new_pos is None and have + len(arr) > step:
                e, k, r, _ = pos
                new_pos = (e, k, r, pos[3] + (step - have))
            parts.append(arr[: need - have])
            have += len(parts[-1])
            if have >= need:
                break
            pos = after
        self.epoch, self.k, self.row, self.tok = new_pos
        buf = torch.from_numpy(np.concatenate(parts))
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)


# ----------------------------------------------------------------------------------------------
# CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"ddplab: error: {message} (see `python -m trainer.data --help`)\n")
        sys.exit(2)


def main(argv=None) -> int:
    p = _Parser(prog="python -m trainer.data", description="Prepare or verify ddplab parquet shards.")
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="write shards + manifest.json")
    pp.add_argument("--out", required=True, type=Path, help="output folder (replaced atomically)")
    pp.add_argument("--source", type=Path, default=None,
                    help="folder of .txt/.jsonl/.parquet (default: the built-in generated corpus)")
    pp.add_argument("--docs", type=int, default=None,
                    help="number of documents (default: 4096 generated, or all of --source)")
    pp.add_argument("--rows-per-group", type=int, default=64, help="rows (documents) per row group")
    pp.add_argument("--groups-per-shard", type=int, default=16, help="row groups per shard file")
    pp.add_argument("--seed", type=int, default=0, help="generator / shuffle seed")
    pv = sub.add_parser("verify", help="check every shard against manifest.json")
    pv.add_argument("dir", type=Path)
    args = p.parse_args(argv)
    try:
        if args.cmd == "prepare":
            print(prepare(args.out, args.source, args.docs, args.rows_per_group, args.groups_per_shard,
                          args.seed))
            return 0
        problems = verify(args.dir)
        if problems:
            print(f"ddplab: error: {len(problems)} problem(s) in {args.dir}: " + "; ".join(problems) +
                  f"; fix: re-run `{PREPARE_HINT.format(d=args.dir)}` with the master's flags or copy the "
                  f"folder from the master", file=sys.stderr)
            return 2
        m = _read_manifest(args.dir)
        print(f"ok: {args.dir}: {len(m['files'])} files, "
              f"{sum(f['row_groups'] for f in m['files'])} row groups, digest {m['digest']}")
        return 0
    except UsageError as e:
        print(f"ddplab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
