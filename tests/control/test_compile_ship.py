"""ddplab/compile_ship.py: the master's compile cache goes to the nodes whose torch, Python, machine, C
library and CPU flags are the master's; each other node is named with what differs."""

from __future__ import annotations

import json
import subprocess
import sys

from ddplab.compile_ship import decide

FP = {"torch": "2.13.0+cpu", "python": "3.11", "machine": "x86_64", "libc": "glibc 2.36",
      "cpu_flags": ["avx", "avx2", "avx512f", "fma", "sse4_2"]}
SEED = {"files": 12, "bytes": 3 << 20, "sha256": "ab" * 32}


def test_matching_nodes_get_it_the_others_are_named_with_what_differs():
    nodes = {"node0": FP, "node1": dict(FP), "node2": FP | {"torch": "2.12.0+cpu"},
             "node3": FP | {"cpu_flags": ["avx", "avx2", "fma", "sse4_2", "sha_ni"]}}
    out = decide({"master": "node0", "seed": SEED, "nodes": nodes})
    assert out["ship"] == ["node0", "node1"]
    text = "\n".join(out["lines"])
    assert "(12 files, 3.0 MiB, warmed by the smoke run) goes to node0, node1" in text
    assert "node2 compiles on its own" in text and "its torch is 2.12.0+cpu, the master's 2.13.0+cpu" in text
    assert "node3 compiles on its own" in text
    assert "lacks the master's avx512f and has sha_ni the master lacks" in text


def test_nothing_compiled_ships_nothing_and_says_so():
    out = decide({"master": "node0", "seed": {"files": 0}, "nodes": {"node0": FP}})
    assert out["ship"] == [] and "compiled nothing" in out["lines"][0]


def test_the_verb_reads_json_and_refuses_other_input_without_a_traceback():
    ok = subprocess.run([sys.executable, "-m", "ddplab", "compile-ship"], capture_output=True, text=True,
                        input=json.dumps({"master": "n", "seed": SEED, "nodes": {"n": FP}}), timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ship"] == ["n"]
    bad = subprocess.run([sys.executable, "-m", "ddplab", "compile-ship"], capture_output=True, text=True,
                         input="nope", timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "not JSON" in bad.stderr


def test_the_nodes_answers_are_read_as_they_printed_them():
    """roles/launch passes `compile-seed pack`'s and each node's `compile-seed fingerprint` output as text."""
    printed = {"master": "n", "seed": json.dumps(SEED),
               "nodes": {"n": json.dumps({"fingerprint": FP}), "m": json.dumps({"fingerprint": FP})}}
    ok = subprocess.run([sys.executable, "-m", "ddplab", "compile-ship"], capture_output=True, text=True,
                        input=json.dumps(printed), timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ship"] == ["m", "n"], ok.stderr
