"""Hitless policy update: UDP traffic H1 -> H2 (through A's SRv6 policy fd00:b::/64) while
UpdatePolicy switches the policy's SID list between R's two End SIDs (fc00:2::e and fc00:2::e2)
ten times. Zero loss: the sender's count, nftables counters on H1 (output) and H2 (input) agree
exactly; R's per-SID `count` counters (read through R's agent) sum to the same number and show
that each interval's traffic took the path the policy had then.

Every drop counter of the path (nstat, link stats, softnet backlog) is read around each trial and
printed. This VM's per-CPU receive backlog is shared with everything else running on it; a trial
whose loss is EXACTLY the number of receive drops the lab's veths counted (backlog overflow, not the
policy change) is repeated, up to 3 trials; any other loss fails at once. If all 3 trials are
disturbed that way, the last passes only if its loss is exactly those counted drops (a packet
dropped by the route swap itself would vanish uncounted)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from segscope_proto.segscope.agent.v1 import srv6_pb2 as pb
from tests.agent.conftest import drop_counters, link_rx_drops

PORT = 40000
RATE_PPS = 3000
DURATION_S = 4.5
PATH_E = ["fc00:2::e", "fc00:3::d6"]
PATH_E2 = ["fc00:2::e2", "fc00:3::d6"]

SENDER = r"""
import json, socket, sys, time
rate, duration, port = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
sent, errors, burst = 0, 0, max(1, rate // 200)          # bursts every 5 ms
t0 = time.monotonic()
while True:
    now = time.monotonic() - t0
    if now >= duration:
        break
    due = int(now * rate) + burst
    while sent + errors < due:
        try:
            s.sendto(b"x" * 64, ("fd00:b::1", port)); sent += 1
        except OSError:
            errors += 1
    time.sleep(0.005)
print(json.dumps({"sent": sent, "errors": errors}))
"""


def nft_counter(lab, node: str, chain: str) -> int:
    out = lab.run(node, ["nft", "list", "chain", "inet", "agt_count", chain], check=True).stdout
    return int(re.search(r"counter packets (\d+)", out).group(1))


def sid_packets(r_srv6) -> dict[str, int]:
    out = {}
    for sid in ("fc00:2::e", "fc00:2::e2"):
        st = r_srv6.GetLocalSid(pb.GetLocalSidRequest(sid=sid), timeout=5).state
        out[sid] = st.counters.packets
    return out


def set_path(a_srv6, segs) -> pb.UpdatePolicyResponse:
    return a_srv6.UpdatePolicy(
        pb.UpdatePolicyRequest(
            policy=pb.Policy(destination="fd00:b::/64", mode=pb.ENCAP_MODE_ENCAP, segments=segs, device="a0")
        ),
        timeout=5,
    )


def trial(lab, a, r) -> dict:
    """One run: traffic + 10 updates; returns every count (nft counters reset per trial)."""
    assert set_path(a, PATH_E).policy.segments == PATH_E
    nft_before = {c: nft_counter(lab, n, c) for n, c in (("H1", "out"), ("H2", "in"), ("H2", "back"))}
    before, drops_before = sid_packets(r), drop_counters(lab)
    sender = lab.popen(
        "H1",
        [sys.executable, "-c", SENDER, str(RATE_PPS), str(DURATION_S), str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.4)
    intervals = []  # (path in force, SID packet counters from its update's answer on)
    path = PATH_E
    for _ in range(10):
        path = PATH_E2 if path == PATH_E else PATH_E
        resp = set_path(a, path)  # the kernel has replaced the route when the answer comes
        assert resp.changed and list(resp.policy.segments) == path
        start = sid_packets(r)
        time.sleep(0.3)
        now = sid_packets(r)
        intervals.append((path[0], {k: now[k] - start[k] for k in now}))
    out, _ = sender.communicate(timeout=30)
    result = json.loads(out.strip().splitlines()[-1])
    time.sleep(0.5)  # last packets drain
    after = sid_packets(r)
    nft = {c: nft_counter(lab, n, c) - nft_before[c] for n, c in (("H1", "out"), ("H2", "in"), ("H2", "back"))}
    t = dict(
        sent=result["sent"],
        send_errors=result["errors"],
        h1_out=nft["out"],
        h2_in=nft["in"],
        h2_back=nft["back"],
        via={k: after[k] - before[k] for k in after},
        intervals=intervals,
        drops={k: v - drops_before.get(k, 0) for k, v in drop_counters(lab).items() if v != drops_before.get(k, 0)},
    )
    t["lost"] = t["h1_out"] - t["h2_in"]
    # packets the lab's veths dropped on receive (backlog overflow: the per-CPU backlog is shared
    # by the whole machine, so other load on this 2-vCPU VM can fill it; each such drop shows as
    # tx_dropped on the sender veth and rx_dropped on its peer) - not caused by the update
    t["link_drops"] = link_rx_drops(t["drops"])
    return t


def test_update_policy_is_hitless(lab, stubs):
    a, r = stubs["A"].srv6, stubs["R"].srv6
    # H1 out: our UDP packets; H2 in: the same arriving; H2 out: anything H2 sends back to H1's
    # subnet (B's return policy also goes through R's fc00:2::e, so it counts there too)
    rules = {
        "H1": [("out", "output", f"ip6 daddr fd00:b::1 udp dport {PORT}")],
        "H2": [("in", "input", f"udp dport {PORT}"), ("back", "output", "ip6 daddr fd00:a::/64")],
    }
    for node, chains in rules.items():
        lab.run(
            node,
            ["nft", "-f", "-"],
            check=True,
            input="table inet agt_count {\n"
            + "".join(
                f" chain {chain} {{\n  type filter hook {hook} priority 0;\n  {match} counter\n }}\n"
                for chain, hook, match in chains
            )
            + "}\n",
        )
    sink = lab.popen(
        "H2",
        [
            sys.executable,
            "-c",
            f"import socket,time\ns=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM)\n"
            f"s.bind(('::',{PORT}))\nprint('ready', flush=True)\nwhile True: s.recv(2048)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink.stdout.readline().strip() == "ready"
        for attempt in range(1, 4):
            t = trial(lab, a, r)
            print(
                f"\nhitless trial {attempt}: sender sent {t['sent']} ({t['send_errors']} send errors), "
                f"H1 out {t['h1_out']}, H2 in {t['h2_in']}, lost {t['lost']}; via fc00:2::e "
                f"{t['via']['fc00:2::e']}, via fc00:2::e2 {t['via']['fc00:2::e2']}; H2 -> H1 packets "
                f"{t['h2_back']}; 10 updates; drop counters that moved: {t['drops']}"
            )
            # a trial whose loss is exactly the backlog drops counted on the lab's links was
            # disturbed by machine load: run another; any other loss fails the test at once
            if t["lost"] > 0 and t["lost"] == t["link_drops"] and attempt < 3:
                continue
            break
        assert t["send_errors"] == 0
        assert t["sent"] >= RATE_PPS * DURATION_S * 0.8, f"sender too slow to make the test meaningful: {t['sent']}"
        assert t["h1_out"] == t["sent"], t
        # zero loss; or, when every trial was disturbed by a machine-wide backlog flood, every lost
        # packet is one the lab's veths counted as a receive-backlog drop (none vanished silently,
        # as a packet dropped by the route swap would)
        assert t["lost"] == 0 or t["lost"] == t["link_drops"], (
            f"lost {t['lost']} of {t['sent']} packets during 10 policy updates, {t['link_drops']} of them "
            f"counted as veth backlog drops; drop counters that moved: {t['drops']}"
        )
        if t["lost"]:
            print(
                f"hitless: no clean trial in 3 (machine load); the {t['lost']} lost packets are exactly "
                f"the {t['link_drops']} counted veth backlog drops"
            )
        assert t["via"]["fc00:2::e"] + t["via"]["fc00:2::e2"] == t["sent"] + t["h2_back"]
        # once UpdatePolicy has answered, the traffic goes over the new path: between the answer
        # and 0.3 s later the old SID counts at most the few packets that were already past A
        for active, delta in t["intervals"]:
            total = sum(delta.values())
            assert total > 0.1 * RATE_PPS * 0.3, (active, delta)
            assert total - delta[active] <= 5, f"interval with {active} active: {delta}"
    finally:
        sink.kill()
        sink.wait()
        for node in rules:
            lab.run(node, ["nft", "delete", "table", "inet", "agt_count"])
        set_path(a, PATH_E)
