"""Control-side plan of a code sync: which files go where, their hashes, and the tree's identity.

Usage: code_tree.py TREES_JSON EXCLUDE_REGEX, where TREES_JSON is a list of {src, dest, mode}:
mode "all" takes every file under src; mode "gitignore" takes what git would commit (tracked and
untracked files that .gitignore does not ignore: `git ls-files --cached --others --exclude-standard`)
when src is inside a git work tree, else every file minus the patterns of src/.gitignore (simple
fnmatch patterns: `name`, `dir/`, `/anchored`, `*.ext`, `a/**/b`; `!` negation is not supported).
`.git` is never taken. Paths matching EXCLUDE_REGEX (relative to src) are left out in every mode.

Prints one JSON object: files [{src, dest}], lines ["<sha256>  <dest>"] sorted by dest, hash (sha256
of the joined lines: the same value the node computes from its copy), trees [{src, dest, method,
files, hash, tree_sha256 (nodeprobe's tree hash of the copy, for preflight), git_commit, git_dirty}].
Exit 2 with one `ddplab: error:` line on bad input.
Standard library only.
"""

import fnmatch
import hashlib
import json
import os
import re
import subprocess
import sys


def fail(msg):
    print(f"ddplab: error: {msg}", file=sys.stderr)
    sys.exit(2)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def walk(src):
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        out += [os.path.relpath(os.path.join(dirpath, n), src) for n in filenames]
    return out


def tree_sha256(src, rels):
    """What nodeprobe.hashing.tree_hash gives for a node's copy of these files (preflight compares the
    two): sha256 over each file's relative path, NUL, bytes, NUL, in sorted path order."""
    h = hashlib.sha256()
    for rel in sorted(rels):
        h.update(rel.encode() + b"\0")
        with open(os.path.join(src, rel), "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


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
    """(relative paths, method, git_commit, git_dirty)."""
    if mode == "all":
        return walk(src), "all", None, None
    inside = git(src, "rev-parse", "--is-inside-work-tree")
    if inside.returncode == 0 and inside.stdout.strip() == "true":
        ls = git(src, "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", ".")
        if ls.returncode != 0:
            fail(f"git ls-files failed in {src}: {ls.stderr.strip()}")
        files = [f for f in ls.stdout.split("\0") if f and os.path.isfile(os.path.join(src, f))]
        head = git(src, "rev-parse", "HEAD")
        status = git(src, "status", "--porcelain", "--untracked-files=normal", "--", ".")
        return (files, "git ls-files", head.stdout.strip() if head.returncode == 0 else None,
                bool(status.stdout.strip()) if status.returncode == 0 else None)
    patterns = gitignore_patterns(src)
    return [f for f in walk(src) if not ignored(f, patterns)], ".gitignore patterns", None, None


def main():
    if len(sys.argv) != 3:
        fail("usage: code_tree.py TREES_JSON EXCLUDE_REGEX")
    trees, exclude = json.loads(sys.argv[1]), re.compile(sys.argv[2])
    files, lines, info = [], [], []
    for tree in trees:
        src, dest = tree["src"].rstrip("/"), tree["dest"].strip("/")
        if not os.path.isdir(src):
            fail(f"code folder {src} does not exist on the control host; "
                 "set ddplab_code_dir to an existing folder")
        rels, method, commit, dirty = list_tree(src, tree.get("mode", "all"))
        rels = sorted(r for r in rels if not exclude.search(r))
        if not rels:
            fail(f"code folder {src} has no files to sync ({method}); "
                 "check ddplab_code_dir and its .gitignore")
        tree_lines = []
        for rel in rels:
            path = os.path.join(src, rel)
            if not os.access(path, os.R_OK):
                fail(f"{path} is not readable; fix its permissions or ignore it in .gitignore")
            files.append({"src": path, "dest": f"{dest}/{rel}"})
            tree_lines.append(f"{sha256_file(path)}  {dest}/{rel}")
        lines += tree_lines
        info.append({"src": src, "dest": dest, "method": method, "files": len(rels),
                     "hash": hashlib.sha256("".join(ln + "\n" for ln in tree_lines).encode()).hexdigest(),
                     "tree_sha256": tree_sha256(src, rels), "git_commit": commit, "git_dirty": dirty})
    order = sorted(range(len(lines)), key=lambda i: files[i]["dest"].encode())
    files, lines = [files[i] for i in order], [lines[i] for i in order]
    digest = hashlib.sha256("".join(ln + "\n" for ln in lines).encode()).hexdigest()
    print(json.dumps({"files": files, "lines": lines, "hash": digest, "trees": info}))


if __name__ == "__main__":
    main()
