"""``python -m ddplab code-tree TREES_JSON``: the control-side plan of a code sync.

TREES_JSON is a list of ``{src, dest, mode[, include]}`` (dest "": src alone, its files at the top, as a
ddplab_sync_dirs folder is planned): mode "all" takes every file under src; mode
"gitignore" takes what git would commit (``git ls-files --cached --others --exclude-standard``) when
src is inside a git work tree, else every file minus the patterns of src/.gitignore (simple fnmatch
patterns: ``name``, ``dir/``, ``/anchored``, ``*.ext``, ``a/**/b``; ``!`` negation is not supported);
``include`` adds the files its globs match although git ignores them (ddplab_code_include,
ddplab/code_include.py). Files that nodeprobe.hashing.EXCLUDE names (bytecode, .git, ...) are left out
in every mode. A file whose realpath is outside src (a symlink that leads out of the folder, e.g. a tracked
``vocab.txt -> ../../.ssh/id_ed25519``) is refused with its path and target (``outside``): rsync's
--copy-links would send what it points at; a link that stays inside src is sent as the file it names.

Prints one JSON object: files [{src, dest}], lines ["<sha256>  <dest>/<rel>"] sorted by path, hash
(the tree hash of those lines: what the node computes from its copy with the same module), trees
[{src, dest, method, files, hash (the tree hash of this folder alone, as preflight's fingerprint
hashes the node's copy), git_commit, git_dirty, included (files added by include)}], placed
({dest: [relative paths]}: the record roles/code_sync writes as code/.ddplab-code-files.json, so that a
node counts, and prunes, only the files ddplab placed).
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess

from ddplab.code_include import included_files
from ddplab.errors import DdplabError
from nodeprobe import hashing


def git(src, *args):
    return subprocess.run(["git", "-C", src, *args], capture_output=True, text=True, check=False, timeout=60)


def gitignore_patterns(src):
    try:
        with open(os.path.join(src, ".gitignore")) as f:
            lines = [ln.strip() for ln in f]
    except OSError:
        return []
    return [ln for ln in lines if ln and not ln.startswith(("#", "!"))]


def ignored(rel, patterns):
    parts = rel.split("/")
    for pat in patterns:
        dir_only = pat.endswith("/")
        pat = pat.rstrip("/")
        anchored = "/" in pat
        pat = pat.lstrip("/")
        # A directory pattern matches any leading folder of the path; a file pattern the whole path too.
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts))] + ([] if dir_only else [rel])
        for p in prefixes:
            if anchored and (fnmatch.fnmatchcase(p, pat) or fnmatch.fnmatchcase(p, pat.replace("**/", ""))):
                return True
            if not anchored and fnmatch.fnmatchcase(p.rsplit("/", 1)[-1], pat):
                return True
    return False


def list_tree(src, mode):
    """(relative paths, method, git_commit, git_dirty), before the exclude list."""
    if mode == "all":
        return hashing.tree_files(src), "all", None, None
    inside = git(src, "rev-parse", "--is-inside-work-tree")
    if inside.returncode == 0 and inside.stdout.strip() == "true":
        ls = git(src, "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", ".")
        if ls.returncode != 0:
            raise DdplabError(f"git ls-files failed in {src}: {ls.stderr.strip()}")
        files = [f for f in ls.stdout.split("\0") if f and os.path.isfile(os.path.join(src, f))]
        head = git(src, "rev-parse", "HEAD")
        status = git(src, "status", "--porcelain", "--untracked-files=normal", "--", ".")
        return (files, "git ls-files", head.stdout.strip() if head.returncode == 0 else None,
                bool(status.stdout.strip()) if status.returncode == 0 else None)
    patterns = gitignore_patterns(src)
    return [f for f in hashing.tree_files(src) if not ignored(f, patterns)], ".gitignore patterns", None, None


def planned_files(src: str, mode: str, include: list[str]) -> tuple[list[str], list[str], str, str | None,
                                                                      bool | None]:
    """(relative paths to send, those only ``include`` added, method, git_commit, git_dirty) of one tree."""
    rels, method, commit, dirty = list_tree(src, mode)
    extra = sorted(set(included_files(src, include)) - set(rels))
    return sorted(r for r in set(rels) | set(extra) if not hashing.excluded(r)), extra, method, commit, dirty


def outside(src: str, rels: list[str]) -> list[tuple[str, str]]:
    """(path, the file it resolves to) of each of ``rels`` whose realpath is not inside src's realpath."""
    root = os.path.realpath(src)
    out = []
    for rel in rels:
        real = os.path.realpath(os.path.join(src, rel))
        if not real.startswith(root + os.sep):
            out.append((os.path.join(src, rel), real))
    return out


def outside_message(src: str, bad: list[tuple[str, str]]) -> tuple[str, str, str]:
    """(found, allowed, fix) of a tree holding links out of it: the first one named, the others counted."""
    path, real = bad[0]
    more = f" (and {len(bad) - 1} more such file{'s' * (len(bad) > 2)})" if len(bad) > 1 else ""
    return (f"{path} is a link to {real}, outside {src}{more}",
            "only files inside the folder are sent (a link that stays inside is sent as the file it names)",
            "replace the link with a copy of the file, or remove it (git rm) or ignore it; nothing was sent")


def refuse_outside(setting: str, src: str, rels: list[str]) -> None:
    """DdplabError naming the first of ``rels`` that resolves outside src (see ``outside``)."""
    bad = outside(src, rels)
    if bad:
        found, allowed, fix = outside_message(src, bad)
        raise DdplabError(f"{setting}: {found}; {allowed}; {fix}")


def plan(trees: list[dict]) -> dict:
    lines, info, placed = [], [], {}
    for tree in trees:
        src, dest = str(tree["src"]).rstrip("/"), str(tree["dest"]).strip("/")
        if not os.path.isdir(src):
            raise DdplabError(f"code folder {src} does not exist on the control host; "
                              "set ddplab_code_dir to an existing folder")
        rels, extra, method, commit, dirty = planned_files(src, tree.get("mode", "all"),
                                                           list(tree.get("include") or []))
        setting = "ddplab_sync_dirs" if dest == "" else \
            "ddplab_code_dir" if tree.get("mode") == "gitignore" else f"code folder {dest}"
        refuse_outside(setting, src, rels)
        if not rels:
            raise DdplabError(f"code folder {src} has no files to sync ({method}); "
                              "check ddplab_code_dir and its .gitignore")
        for rel in rels:
            if not os.access(os.path.join(src, rel), os.R_OK):
                raise DdplabError(f"{os.path.join(src, rel)} is not readable; fix its permissions or "
                                  "ignore it in .gitignore")
        own = hashing.tree_lines(src, rels)
        lines += [(f"{dest}/{rel}" if dest else rel, os.path.join(src, rel), ln.split("  ", 1)[0])
                  for rel, ln in zip(rels, own, strict=True)]
        info.append({"src": src, "dest": dest, "method": method, "files": len(rels),
                     "hash": hashing.lines_digest(own), "git_commit": commit, "git_dirty": dirty,
                     "included": len(extra)})
        placed[dest] = rels
    lines.sort()
    sums = [f"{sha}  {dest}" for dest, _, sha in lines]
    return {"files": [{"src": src, "dest": dest} for dest, src, _ in lines], "lines": sums,
            "hash": hashing.lines_digest(sums), "trees": info, "placed": placed}


def add_parser(sub):
    p = sub.add_parser("code-tree", help="plan a code sync: file list, sum lines and tree hashes (JSON)")
    p.add_argument("trees", help='JSON list of {"src", "dest", "mode": "all" | "gitignore"}')
    p.set_defaults(func=cmd_code_tree)


def cmd_code_tree(args):
    try:
        trees = json.loads(args.trees)
        if not isinstance(trees, list) or not all(isinstance(t, dict) and "src" in t and "dest" in t
                                                  for t in trees):
            raise ValueError("expected a list of {src, dest, mode}")
    except ValueError as e:
        raise DdplabError(f"code-tree: TREES_JSON {args.trees[:80]!r} is not usable ({e}); "
                          'pass [{"src": DIR, "dest": NAME, "mode": "all"}]') from None
    print(json.dumps(plan(trees)))
    return 0
