"""The documents to train on: a deterministic built-in corpus, or the texts of a source folder.

The built-in corpus is English-like with learnable structure (stories, facts, sums) and depends only on
the seed, so every node that runs the same `prepare` gets the same bytes without a download.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from trainer.config import UsageError

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
