"""Random and mutated datagrams through the user-space reflector (tests/ustamp/fuzz_reflector.py).

Runs in a private netns `usfz`; USTAMP_FUZZ_COUNT datagrams (default 30000, ~4 s; 100000 takes ~12 s,
see collectors/ustamp/README.md for that run). No exception, every datagram in exactly one outcome
counter, outcomes as an independent oracle expects them, no reply to a short, unknown or
unauthenticated datagram, every reflected reply re-parsed.
"""

from __future__ import annotations

import json
import os
import subprocess

from ustamp_env import PY, REPO

from tests.isolation import own_name

NETNS = own_name("usfz")


def test_fuzz_reflector_accounts_for_every_datagram():
    count = int(os.environ.get("USTAMP_FUZZ_COUNT", "30000"))
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up"], check=True)
        res = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                NETNS,
                PY,
                str(REPO / "tests" / "ustamp" / "fuzz_reflector.py"),
                "--count",
                str(count),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    assert res.returncode in (0, 1), res.stderr  # 1 = a property failed (details below)
    out = json.loads(res.stdout)
    assert out["n_mismatches"] == 0, out["mismatches"]
    assert out["received"] == out["accounted"] == count
    assert out["stray_replies"] == 0
    o = out["outcomes"]
    # every generator contributed and every path was taken
    assert min(out["kinds"].values()) > count // 10
    for outcome in ("reflected", "unknown_session", "malformed_short", "auth_failed"):
        assert o.get(outcome, 0) > count // 50, (outcome, o)
    assert out["replies_checked"] > count // 5
    assert out["tlv"]["tlv_malformed"] > 0 and out["tlv"]["tlv_integrity_failed"] > 0
    assert res.returncode == 0
