"""stamp_sender on the emulated SRv6 network (netlab line5): A -> R (End) -> B, as in the demo.

Captured on B's b0: R has executed End (segments_left 1 -> 0, destination rewritten to the
reflector address), the final destination in segments[0] is untouched, and the STAMP payload
arrives intact. No reflector runs here, so B's stack answers with ICMPv6 port unreachable,
which shows the reverse SRv6 path back to A works too.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from collectors_pcap import capture
from scapy.all import UDP, ICMPv6DestUnreach, IPv6, IPv6ExtHdrSegmentRouting, rdpcap  # type: ignore

from segscope_schemas import stamp_test_packet as tp
from tests.isolation import own_name

pytestmark = pytest.mark.datapath

PREFIX = own_name("coSR")  # netns coSR-A, coSR-R, ... (ours: starts with "co")


@pytest.fixture(scope="module")
def lab():
    from netlab.lab import Lab, teardown

    teardown(PREFIX)
    lab = Lab.up("netlab/topologies/line5.yaml", PREFIX)
    try:
        yield lab
    finally:
        lab.down()


def test_sender_over_srv6_end(collectors_build, lab, work_dir):
    on_b, on_a = work_dir / "b0.pcap", work_dir / "a0.pcap"
    with capture(lab.ns("B"), "b0", on_b), capture(lab.ns("A"), "a0", on_a):
        res = subprocess.run(
            [
                str(collectors_build / "stamp_sender"),
                "--netns",
                lab.ns("A"),
                "--src",
                "fc00:1::1",
                "--dst",
                "fc00:3::1",
                "--segs",
                "fc00:2::e",
                "--ssid",
                "1",
                "--rate",
                "200",
                "--count",
                "20",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        time.sleep(0.2)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["sent"] == 20

    at_b = [p for p in rdpcap(str(on_b)) if IPv6ExtHdrSegmentRouting in p and UDP in p and p[IPv6].src == "fc00:1::1"]
    assert len(at_b) == 20
    for i, p in enumerate(at_b):
        srh = p[IPv6ExtHdrSegmentRouting]
        assert p[IPv6].dst == "fc00:3::1" and p[IPv6].hlim == 63  # one SRv6 hop (R)
        assert (srh.segleft, srh.lastentry, srh.addresses) == (0, 1, ["fc00:3::1", "fc00:2::e"])
        assert (p[UDP].sport, p[UDP].dport) == (50001, tp.STAMP_PORT)
        pkt = tp.SenderPacket.decode(bytes(p[UDP].payload))
        assert (pkt.seq, pkt.ssid) == (i, 1)

    # B's port-unreachable errors came back to A over B's SRv6 policy (decapsulated on A)
    unreach = [p for p in rdpcap(str(on_a)) if ICMPv6DestUnreach in p]
    assert len(unreach) >= 1
