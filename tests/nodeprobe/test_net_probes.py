"""listen / connect / resolve / iface on loopback with real sockets."""

from __future__ import annotations

import contextlib
import json
import socket
import time

from tests.helpers.probes import popen_probe, probe


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_listen_prints_port_at_once_and_answers_until_quit():
    p = popen_probe("listen", "--port", "0", "--seconds", "20", "--bind", "127.0.0.1")
    try:
        t0 = time.monotonic()
        head = json.loads(p.stdout.readline())
        assert head["ok"] and head["port"] > 0
        assert time.monotonic() - t0 < 10
        r = probe("connect", "--host", "127.0.0.1", "--port", str(head["port"]), "--timeout", "2")
        assert r["ok"] and r["result"] == "connected" and r["nodeprobe_listener"] is True
        assert r["banner"].endswith(str(head["port"]))
        probe("connect", "--host", "127.0.0.1", "--port", str(head["port"]), "--quit")
        assert p.wait(timeout=5) == 0  # ended by quit, long before its 20 s
        assert p.stdout.read().strip() == ""  # one JSON object only
    finally:
        p.kill()
        p.wait(timeout=5)


# The connect probe below starts a Python (0.1-0.3 s at load 6, seconds on a loaded CI machine) while the
# listener lives: 1.5 s of life left it ~1.2 s. Then the test waits for the listener to end by itself.
BACKGROUND_S = 4


def test_background_listener_detaches_and_ends_itself():
    t0 = time.monotonic()
    head = probe("listen", "--port", "0", "--seconds", str(BACKGROUND_S), "--bind", "127.0.0.1",
                 "--background")
    up = time.monotonic()
    assert up - t0 < 10 and head["ok"]
    r = probe("connect", "--target", f"me=127.0.0.1:{head['port']}", "--timeout", "2")
    late, me = time.monotonic() - up, r["targets"]["me"]
    assert me["ok"], f"the connect ended {late:.1f} s after the listen: make its life longer" \
        if late >= BACKGROUND_S else r
    assert me["nodeprobe_listener"]
    while time.monotonic() - up < 60:  # its --seconds are over: nothing listens any more
        r = probe("connect", "--host", "127.0.0.1", "--port", str(head["port"]), "--timeout", "2")
        if not r["ok"]:
            break
        time.sleep(0.5)
    assert not r["ok"] and r["result"] == "refused"


def test_listen_on_a_held_port_reports_eaddrinuse():
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen(1)
    try:
        r = probe("listen", "--port", str(s.getsockname()[1]), "--seconds", "1")
        assert r["ok"] is False and r["errno"] == "EADDRINUSE"
    finally:
        s.close()


def test_connect_tells_refused_from_timeout_and_foreign_listener():
    refused = _closed_port()
    # A listener whose accept queue is full: the kernel drops further SYNs, as a DROP firewall does.
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    held = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(full.getsockname())
        held.append(c)
    # A plain listener that is not ours (like a stale process): connects, but no nodeprobe banner.
    foreign = socket.socket()
    foreign.bind(("127.0.0.1", 0))
    foreign.listen(4)
    try:
        time.sleep(0.2)
        r = probe("connect", "--timeout", "1",
                  "--target", f"a=127.0.0.1:{refused}",
                  "--target", f"b=127.0.0.1:{full.getsockname()[1]}",
                  "--target", f"c=127.0.0.1:{foreign.getsockname()[1]}")
        a, b, c = (r["targets"][k] for k in "abc")
        assert (a["ok"], a["result"], a["errno"]) == (False, "refused", "ECONNREFUSED")
        assert (b["ok"], b["result"]) == (False, "timeout")
        assert 0.9 <= b["elapsed_s"] < 3
        assert c["ok"] and c["nodeprobe_listener"] is False
    finally:
        for s in [full, foreign, *held]:
            s.close()


def test_resolve_reports_this_hostname():
    r = probe("resolve")
    assert r["hostname"] == socket.gethostname()
    if r["resolves"]:
        expected = {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None)}
        assert {a["address"] for a in r["addresses"]} == expected
        assert r["any_loopback"] == any(a.startswith("127.") or a == "::1" for a in expected)
        assert r["first_ipv6"] == (":" in r["addresses"][0]["address"])


def test_iface_toward_loopback_master():
    r = probe("iface", "--master", "127.0.0.1")
    assert r["ok"] and r["dev"] == "lo" and r["family"] == "ipv4" and r["same_subnet"] is True
    assert any(i["name"] == "lo" and "ipv4" in i["families"] for i in r["interfaces"])
