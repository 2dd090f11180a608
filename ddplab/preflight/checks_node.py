"""Checks of one node's fingerprint against the run and the other nodes: python, torch and gloo,
dtype, threads, memory, disk."""

from __future__ import annotations

from ddplab.preflight import memory_fit
from ddplab.preflight.judge import NA, OK, Judge, gib
from ddplab.trainer_flags import switch
from nodeprobe import cpu_power as power_facts
from nodeprobe import hashing

# A venv with the pinned torch, numpy and pyarrow (shared/notes/simulated-hosts.md: about 945 MB measured).
VENV_BYTES = 1 << 30


def python(j: Judge, h: str) -> None:
    fp = j.need(h, "python", "fingerprint")
    if not fp:
        return
    mine = fp["python"]
    ref_h, ref = j.reference(lambda f: f["python"])
    if ref_h and ref_h != h and ref["major_minor"] != mine["major_minor"]:
        # Not a failure: prepare cannot change a node's Python (Debian 12 has 3.11, Debian 13 3.13), and what
        # must match is torch (the torch check). gloo across 3.11 and 3.13 with torch 2.13 was measured
        # exact (docs/laptops.md, "Two Debian releases").
        j.set(h, "python", OK, f"python {mine['version']} on {h} vs {ref['version']} on {ref_h}: different "
                               "minor versions; the same torch on both is what matters (the torch check)",
              note="info")
    else:
        note = f" (micro differs from {ref_h}: {ref['version']})" if ref and ref["version"] != mine[
            "version"] else ""
        j.set(h, "python", OK, f"{mine['version']} {mine['executable']}{note}")


def same_source(a: dict, b: dict) -> bool:
    """Two torch builds of one release from one commit (2.13.0+cpu and 2.13.0+cu130: CPU-only and CUDA)."""
    return (a["version"].split("+")[0] == b["version"].split("+")[0] and bool(a.get("git_version"))
            and a.get("git_version") == b.get("git_version"))


def torch(j: Judge, h: str) -> None:
    fp = j.need(h, "torch", "fingerprint")
    if not fp:
        return
    t = fp["torch"]
    want = j.inv.get("torch_version")
    ref_h, ref = j.reference(lambda f: f["torch"] if f["torch"].get("importable") else None)
    pin = want or (ref["version"].split("+")[0] if ref else "<version>")
    fix = f"pip install torch=={pin}  # on {h}, or re-run playbooks/prepare.yml (torch environment)"
    if not t.get("importable"):
        j.fail(h, "torch", f"torch does not import on {h}: {t.get('error')}", fix)
        j.fail(h, "gloo", "torch does not import", fix)
        return
    base = t["version"].split("+")[0]
    build = f"{t['version']} ({(t.get('git_version') or '?')[:10]})"
    if want and base != str(want):
        j.fail(h, "torch", f"torch {t['version']} on {h}, the run pins {want}", fix)
    elif ref_h and ref_h != h and t["version"] != ref["version"] and not same_source(t, ref):
        j.fail(h, "torch", f"torch {t['version']} on {h} vs {ref['version']} on {ref_h}", fix)
    elif ref_h and ref_h != h and t["version"] != ref["version"]:
        # PyPI's Linux torch for a Python that has no +cpu wheel within reach is the CUDA build: the same
        # commit, and its gloo ran exact collectives with a +cpu rank here (docs/laptops.md)
        j.set(h, "torch", OK, f"torch {t['version']} on {h} vs {ref['version']} on {ref_h}: the same source "
                              f"(commit {t['git_version'][:10]}), another build; gloo is the same code",
              note="info")
    elif ref_h and ref_h != h and t.get("git_version") != ref.get("git_version"):
        j.fail(h, "torch", f"same version, different build on {h}: {t.get('git_version')} vs "
                              f"{ref.get('git_version')} on {ref_h}", fix)
    else:
        j.set(h, "torch", OK, build)
    if not t.get("gloo_available"):
        j.fail(h, "gloo", f"torch {t['version']} on {h} has no gloo backend",
                  f"pip install torch=={pin}  # the CPU wheel includes gloo")
    elif "gloo" not in j.rows[h]:
        j.set(h, "gloo", OK, "gloo available")


def dtype(j: Judge, h: str) -> None:
    fp = j.need(h, "dtype", "fingerprint")
    if not fp:
        return
    d = fp["dtype"]
    ref_h, ref = j.reference(lambda f: f["dtype"]["resolved"])
    if d.get("problem"):
        j.fail(h, "dtype", f"{d['problem']} ({d['reason']})", "use --dtype fp32")
    elif ref_h and ref_h != h and d["resolved"] != ref:
        j.fail(h, "dtype", f"{h} resolves {d['resolved']} ({d['reason']}), {ref_h} resolves {ref}",
                  "use --dtype fp32 on every node")
    else:
        j.set(h, "dtype", OK, f"{d['resolved']}: {d['reason']}")


def threads(j: Judge, h: str) -> None:
    fp = j.need(h, "threads", "fingerprint")
    if not fp:
        return
    cpu = fp["cpu"]
    phys = cpu.get("physical_cores")
    share = j.sharing(h)
    threads = [cpu.get("threads") or j.setting(x, "threads") for x in share]
    if not all(threads):
        j.set(h, "threads", OK, f"threads not set (trainer default); {phys} physical cores, "
                                   f"{cpu.get('logical')} logical")
        return
    total = sum(int(t) for t in threads)
    where = f"{len(share)} ranks on this machine x {threads[0]}" if len(share) > 1 else f"{total}"
    if phys and total > phys:
        per = max(1, phys // len(share))
        j.fail(h, "threads", f"threads {where} > {phys} physical cores ({cpu.get('logical')} logical)",
                  f"set ddplab_threads <= {per} (physical cores{' / ranks' if len(share) > 1 else ''})")
    else:
        j.set(h, "threads", OK, f"threads {where} <= {phys} physical cores")


def cpu_power(j: Judge, h: str) -> None:
    """A warning when the node's CPUs are held to a low clock (governor, energy preference) or were thermally
    throttled: that rank becomes the straggler every other rank waits for. n/a where sysfs exposes neither."""
    fp = j.need(h, "cpu_power", "fingerprint")
    if not fp:
        return
    facts = (fp.get("cpu") or {}).get("power") or {}
    if not facts.get("exposed"):
        j.set(h, "cpu_power", NA, "no cpufreq governor or thermal_throttle counts in /sys on this node")
        return
    slow, hot = power_facts.slow_cpus(facts), power_facts.throttled_cpus(facts)
    found = []
    if slow:
        found.append(f"{_cpu_list(slow)} held to a low clock ({next(iter(slow.values()))}): "
                     f"fix: {power_facts.GOVERNOR_FIX} on {h} (package linux-cpupower; lasts until a reboot)")
    if hot:
        found.append(f"{_cpu_list(hot)} thermally throttled ({sum(hot.values())} events since boot): "
                     f"cool it (air flow, not on a bed, lid open, plugged in); with a slower node set "
                     "ddplab_balance: true")
    governors = sorted(set((facts.get("governors") or {}).values()))
    if found:
        j.set(h, "cpu_power", OK, "; ".join(found), note="warning")
    else:
        j.set(h, "cpu_power", OK, f"governor {', '.join(governors) or 'not exposed'}, no throttling seen")


def _cpu_list(cpus: dict) -> str:
    names = list(cpus)
    return ", ".join(names) if len(names) <= 4 else f"{len(names)} CPUs ({names[0]}, ...)"


def memory(j: Judge, h: str) -> None:
    fp = j.need(h, "memory", "fingerprint")
    if not fp:
        return
    m = fp["memory"]
    n = len(j.sharing(h))
    avail = m.get("available_bytes")
    if avail is not None and memory_fit.sizes_known(m.get("sizes")):  # ddplab's trainer: DDP or sharded
        fit = memory_fit.judge(m["sizes"], avail, n, h, switch(j.inv.get("shard", False)), gib)
        if fit.ok:
            j.set(h, "memory", OK, fit.detail)
        else:
            j.fail(h, "memory", fit.detail, fit.fix)
        return
    need = m.get("estimate_bytes") or 0
    total = need * n
    what = f"~{gib(total)} estimated ({m.get('estimate_method')}{f', x{n} ranks' if n > 1 else ''})"
    if avail is None:
        j.set(h, "memory", OK, f"{what}; available memory unknown")
    elif total > avail:
        j.fail(h, "memory", f"{what} > {gib(avail)} available on {h}",
                  f"free memory on {h} or train a smaller model (lower --depth / --batch-size)")
    else:
        j.set(h, "memory", OK, f"{what} <= {gib(avail)} available")


def disk(j: Judge, h: str) -> None:
    """Free space in the lab folder's file system against what the run still needs there: the shards the
    node lacks, a venv when torch does not import, and the checkpoints the trainer keeps."""
    fp = j.need(h, "disk", "fingerprint")
    if not fp:
        return
    d = fp.get("disk") or {}
    if d.get("error") or "free_bytes" not in d:
        j.set(h, "disk", OK, f"free space unknown ({d.get('error', 'no disk facts')})")
        return
    n = len(j.sharing(h))  # ranks of one machine share its disk (the local inventory)
    parts = {"checkpoints": d["checkpoint_bytes"] * d["checkpoints"] * n}
    parts["shards"] = _missing_shard_bytes(j, fp)
    if not (fp.get("torch") or {}).get("importable"):
        parts["venv"] = VENV_BYTES
    need = sum(parts.values())
    what = " + ".join(f"{k} {gib(v)}" for k, v in parts.items() if v)
    if d["free_bytes"] < need:
        j.fail(h, "disk", f"{gib(d['free_bytes'])} free in {d['path']} on {h} ({d['free_bytes']} bytes), "
                          f"the run needs {gib(need)} ({need} bytes: {what})",
               f"free {gib(need - d['free_bytes'])} on {h}, or set ddplab_root (-e ddplab_root=...) to a "
               "folder on a larger disk")
    else:
        j.set(h, "disk", OK, f"{gib(d['free_bytes'])} free in {d['path']} >= {gib(need)} needed "
                             f"({what or 'nothing'})")


def _missing_shard_bytes(j: Judge, fp: dict) -> int:
    """Bytes of the control host's shards that this node lacks or holds changed (sizes read there)."""
    if not j.shard_bytes:
        return 0
    data = fp.get("data") or {}
    if data.get("error") or "files" not in data:
        return sum(j.shard_bytes.values())  # no shard folder on the node yet
    diff = hashing.compare(data["files"], hashing.manifest_files(j.manifest))
    return sum(j.shard_bytes.get(f, 0) for f in diff["missing"] + diff["changed"])
