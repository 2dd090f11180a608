"""Checks of the node's copies against the control host: code trees, shards and ddplab_sync_dirs folders
(nodeprobe.hashing)."""

from __future__ import annotations

from ddplab.preflight.judge import NA, OK, SKIP, Judge
from nodeprobe import hashing


def code(j: Judge, h: str) -> None:
    fp = j.need(h, "code", "fingerprint")
    if not fp:
        return
    code = fp.get("code") or {}
    if not code:
        j.set(h, "code", SKIP, "fingerprint ran without --code")
        return
    bad, shown = [], []
    for name, info in sorted(code.items()):
        if info.get("error"):
            bad.append(f"{name}: {info['error']}")
            continue
        ref = (j.control_code.get(name) or {}).get("sha256")
        ref_from = "the control host"
        if ref is None:
            ref_h, ref = j.reference(lambda f, n=name: f["code"][n]["sha256"])
            ref_from = ref_h
        if ref and ref_from != h and info["sha256"] != ref:
            bad.append(f"{name}/ differs from {ref_from} ({info['sha256'][:12]} vs {ref[:12]})")
        shown.append(f"{name} {info['sha256'][:12]}")
    if bad:
        names = ", ".join(sorted({b.split('/')[0].split(':')[0] for b in bad}))
        j.fail(h, "code", "; ".join(bad), f"re-run playbooks/prepare.yml to sync {names}/ to {h}")
    else:
        j.set(h, "code", OK, ", ".join(shown))


def data(j: Judge, h: str) -> None:
    fp = j.need(h, "data", "fingerprint")
    if not fp:
        return
    data = fp.get("data")
    fix_all = "re-run playbooks/prepare.yml (dataset)"
    if not data:
        if j.manifest is None:  # no shards asked for (your own code with ddplab_data_dir "")
            j.set(h, "data", NA, "no shards (ddplab_data_dir is empty)")
        else:
            j.set(h, "data", SKIP, "fingerprint ran without --data")
        return
    if data.get("error"):
        j.fail(h, "data", data["error"], fix_all)
        return
    if j.manifest is not None:
        expected, ref_name = hashing.manifest_files(j.manifest), "the control host's manifest"
    else:
        ref_h, expected = j.reference(lambda f: (f.get("data") or {}).get("files"))
        ref_name = ref_h
        if ref_h == h or expected is None:
            j.set(h, "data", OK, f"{data['count']} shards, digest {data['digest'][:12]} "
                                    "(no control manifest to compare with)")
            return
    diff = hashing.compare(data["files"], expected)
    parts = [f"{k}: {', '.join(v)}" for k, v in diff.items() if v]
    if parts:
        files = diff["missing"] + diff["changed"]
        fixes = [fix_all + f" to resync {', '.join(files)}"] if files else []
        if diff["extra"]:  # prepare prunes only the shards it placed (its record): these are someone's
            fixes.append(f"remove {', '.join(diff['extra'])} from the data folder on {h} yourself (ddplab "
                         "did not place it and keeps files it did not place)")
        fix = "; ".join(fixes)
        j.fail(h, "data", f"shards on {h} differ from {ref_name}: " + "; ".join(parts), fix)
        return
    node_digest = data.get("manifest_digest")
    if j.manifest is not None and node_digest not in (None, j.manifest.get("digest")):
        j.fail(h, "data", f"{h}'s manifest.json is not the control host's (digest "
                             f"{str(node_digest)[:12]})", fix_all + " to resync manifest.json")
        return
    j.set(h, "data", OK, f"{data['count']} shards, digest {data['digest'][:12]} matches {ref_name}")


def sync_dirs(j: Judge, h: str) -> None:
    """Each ddplab_sync_dirs folder on the node (only the files ddplab placed) against its src here."""
    if not j.control_sync:
        j.set(h, "sync_dirs", NA, "no ddplab_sync_dirs")
        return
    fp = j.need(h, "sync_dirs", "fingerprint")
    if not fp:
        return
    have = fp.get("sync_dirs") or {}
    bad, shown = [], []
    for dest, ref in sorted(j.control_sync.items()):
        info = have.get(dest)
        if info is None:
            bad.append(f"{dest}: not hashed (fingerprint ran without --sync-dir)")
        elif info.get("error"):
            bad.append(f"{dest}: not on the node ({info['error']})")
        elif info["sha256"] != ref["sha256"]:
            bad.append(f"{dest}/ differs from {ref['path']} on the control host ({info['files']} vs "
                       f"{ref['files']} files, {info['sha256'][:12]} vs {ref['sha256'][:12]})")
        else:
            shown.append(f"{dest} {info['files']} files {info['sha256'][:12]}")
    if bad:
        dests = ", ".join(b.split(":")[0].split("/ ")[0] for b in bad)
        j.fail(h, "sync_dirs", "; ".join(bad),
               f"re-run playbooks/prepare.yml (--tags sync: these folders alone) to sync {dests} to {h}")
    else:
        j.set(h, "sync_dirs", OK, ", ".join(shown))
