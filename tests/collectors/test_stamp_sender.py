"""stamp_sender on a real veth pair between two netns, checked by capturing what it emits."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from collectors_pcap import capture
from scapy.all import UDP, IPv6, IPv6ExtHdrSegmentRouting, rdpcap  # type: ignore

from segscope_schemas import stamp_error_estimate as ee
from segscope_schemas import stamp_test_packet as tp
from segscope_schemas import stamp_timestamp as ts
from segscope_schemas import stamp_tlv as stlv

pytestmark = pytest.mark.datapath

SIDS = ["fc00:2::e", "fc00:7::e"]  # visiting order
FINAL_DST = "fc00:3::1"


def run_sender(build: Path, pair, *args: str, timeout: float = 30) -> dict:
    res = subprocess.run(
        [str(build / "stamp_sender"), "--netns", pair.snd_ns, "--src", pair.snd_addr, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def udp_packets(pcap: Path, sport: int):
    """The sender's datagrams (not the copies quoted in the peer's ICMPv6 errors)."""
    return [p for p in rdpcap(str(pcap)) if UDP in p and p[UDP].sport == sport and p[IPv6].src == "fd00:c0::1"]


def tai_minus_realtime_ns() -> int:
    """CLOCK_TAI - CLOCK_REALTIME: the kernel's TAI offset, a whole number of seconds. Rounded,
    because the two reads are not simultaneous (a preemption between them would skew it)."""
    diff = time.clock_gettime_ns(time.CLOCK_TAI) - time.time_ns()
    return round(diff / 1e9) * 1_000_000_000


def test_srh_layout_and_packet_contents(collectors_build, veth_pair, work_dir):
    pcap = work_dir / "srh.pcap"
    with capture(veth_pair.rcv_ns, veth_pair.rcv_if, pcap):
        summary = run_sender(
            collectors_build,
            veth_pair,
            "--dst",
            FINAL_DST,
            "--segs",
            ",".join(SIDS),
            "--ssid",
            "7",
            "--rate",
            "200",
            "--count",
            "50",
        )
    assert summary == {**summary, "ssid": 7, "sent": 50, "send_errors": 0, "first_seq": 0, "last_seq": 49}
    pkts = udp_packets(pcap, 50007)
    assert len(pkts) == 50
    offset = tai_minus_realtime_ns()
    for i, p in enumerate(pkts):
        ip6 = p[IPv6]
        srh = p[IPv6ExtHdrSegmentRouting]
        # the packet travels to the first SID; the final destination sits in segments[0]
        assert ip6.src == veth_pair.snd_addr
        assert ip6.dst == SIDS[0]
        assert ip6.nh == 43 and srh.type == 4
        assert srh.segleft == 2 and srh.lastentry == 2
        assert srh.addresses == [FINAL_DST, SIDS[1], SIDS[0]]
        assert srh.nh == 17
        udp = p[UDP]
        assert (udp.sport, udp.dport) == (50007, tp.STAMP_PORT)
        payload = bytes(udp.payload)
        assert len(payload) == tp.STAMP_BASE_LEN
        assert payload[16:] == bytes(28)  # MBZ
        pkt = tp.SenderPacket.decode(payload)
        assert pkt.seq == i and pkt.ssid == 7
        assert pkt.err_est & tp.EE_Z  # PTPv2 timestamps
        assert pkt.ts_frac < tp.NS_PER_SEC
        t1 = tp.ptp_to_ns(pkt.ts_sec, pkt.ts_frac, time.clock_gettime_ns(time.CLOCK_TAI))
        captured_tai = int(p.time * 1_000_000_000) + offset
        assert 0 <= captured_tai - t1 < 5_000_000, (i, captured_tai - t1)  # T1 just before the wire
        # UDP checksum over the pseudo-header with the FINAL destination (RFC 8200 §8.1)
        want = udp.chksum
        del udp.chksum
        assert IPv6(bytes(ip6))[UDP].chksum == want


def test_single_sid(collectors_build, veth_pair, work_dir):
    pcap = work_dir / "one.pcap"
    with capture(veth_pair.rcv_ns, veth_pair.rcv_if, pcap):
        run_sender(
            collectors_build,
            veth_pair,
            "--dst",
            FINAL_DST,
            "--segs",
            SIDS[0],
            "--ssid",
            "3",
            "--rate",
            "100",
            "--count",
            "5",
            "--sport",
            "40003",
        )
    pkts = udp_packets(pcap, 40003)
    assert len(pkts) == 5
    srh = pkts[0][IPv6ExtHdrSegmentRouting]
    assert pkts[0][IPv6].dst == SIDS[0]
    assert (srh.segleft, srh.lastentry, srh.addresses) == (1, 1, [FINAL_DST, SIDS[0]])


def test_rate_is_exact_at_1000pps(collectors_build, veth_pair, work_dir):
    pcap = work_dir / "rate.pcap"
    with capture(veth_pair.rcv_ns, veth_pair.rcv_if, pcap):
        summary = run_sender(
            collectors_build,
            veth_pair,
            "--dst",
            FINAL_DST,
            "--segs",
            SIDS[0],
            "--ssid",
            "9",
            "--rate",
            "1000",
            "--duration",
            "2",
        )
    assert summary["send_errors"] == 0
    assert 1960 <= summary["sent"] <= 2040
    pkts = udp_packets(pcap, 50009)
    assert len(pkts) == summary["sent"]
    seqs = [tp.SenderPacket.decode(bytes(p[UDP].payload)).seq for p in pkts]
    assert seqs == list(range(len(pkts)))
    span_s = float(pkts[-1].time - pkts[0].time)
    rate = (len(pkts) - 1) / span_s
    assert abs(rate - 1000) <= 20, rate
    # T1 spacing says the same as the wire spacing
    t1 = [tp.SenderPacket.decode(bytes(p[UDP].payload)) for p in (pkts[0], pkts[-1])]
    t1_span = (t1[1].ts_sec - t1[0].ts_sec) + (t1[1].ts_frac - t1[0].ts_frac) / 1e9
    assert abs((len(pkts) - 1) / t1_span - 1000) <= 20


def test_no_srh_plain_udp_with_padding(collectors_build, veth_pair):
    """Without --segs: a plain UDP datagram, received by a real socket on the peer."""
    recv = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            veth_pair.rcv_ns,
            "python3",
            "-c",
            "import socket,sys\n"
            "s=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM); s.bind(('fd00:c0::2',862)); s.settimeout(5)\n"
            "print('ready',flush=True)\n"
            "for _ in range(3):\n"
            "    d,a=s.recvfrom(2000); print(d.hex(),a[0],a[1],flush=True)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert recv.stdout.readline().strip() == "ready"
    summary = run_sender(
        collectors_build,
        veth_pair,
        "--dst",
        veth_pair.rcv_addr,
        "--ssid",
        "65",
        "--rate",
        "50",
        "--count",
        "3",
        "--padding",
        "20",
    )
    out, _ = recv.communicate(timeout=10)
    lines = out.split()
    assert summary["sent"] == 3
    assert len(lines) == 9
    for i in range(3):
        data, src, sport = bytes.fromhex(lines[3 * i]), lines[3 * i + 1], int(lines[3 * i + 2])
        assert (src, sport) == (veth_pair.snd_addr, 50065)
        assert len(data) == tp.STAMP_BASE_LEN + 20 and data[tp.STAMP_BASE_LEN :] == bytes(20)
        pkt = tp.SenderPacket.decode(data)
        assert (pkt.seq, pkt.ssid) == (i, 65)


def test_error_estimate_matches_adjtimex(collectors_build, veth_pair, work_dir):
    """S, Scale and Multiplier from the kernel clock by the shared rule (schemas: esterror when
    synchronised, maxerror when free-running, never understated), Z from the format."""
    pcap = work_dir / "ee.pcap"
    with capture(veth_pair.rcv_ns, veth_pair.rcv_if, pcap):
        ptp = run_sender(
            collectors_build,
            veth_pair,
            "--dst",
            FINAL_DST,
            "--segs",
            SIDS[0],
            "--ssid",
            "11",
            "--rate",
            "100",
            "--count",
            "2",
        )
        ntp = run_sender(
            collectors_build,
            veth_pair,
            "--dst",
            FINAL_DST,
            "--segs",
            SIDS[0],
            "--ssid",
            "13",
            "--rate",
            "100",
            "--count",
            "2",
            "--format",
            "ntp",
        )
    cs = ee.clock_read()
    assert ntp["tai_offset_s"] == cs.tai_offset_s  # without --tai-offset: adjtimex's struct timex.tai
    for sport, summary, fmt in ((50011, ptp, ts.TsFormat.PTP), (50013, ntp, ts.TsFormat.NTP)):
        wire = tp.SenderPacket.decode(bytes(udp_packets(pcap, sport)[0][UDP].payload)).err_est
        assert wire == summary["error_estimate"] == ee.ee_from_clock(cs, fmt)
        f = ee.ee_unpack(wire)
        assert f.s == cs.synced and f.z == (fmt == ts.TsFormat.PTP) and f.multiplier >= 1
        assert ee.ee_to_error_ns(f.scale, f.multiplier) >= ee.clock_error_ns(cs)  # never understated


def test_ntp_format_and_tlvs(collectors_build, veth_pair, work_dir):
    """--format ntp: T1 is UTC since 1900 (CLOCK_TAI - --tai-offset), Z = 0; --tlv appends the TLVs
    byte for byte after the 44-byte base packet, flags default U = 1 (RFC 8972 §4)."""
    pcap = work_dir / "ntp.pcap"
    offset_s = 37
    with capture(veth_pair.rcv_ns, veth_pair.rcv_if, pcap):
        summary = run_sender(
            collectors_build,
            veth_pair,
            "--dst",
            FINAL_DST,
            "--segs",
            SIDS[0],
            "--ssid",
            "14",
            "--rate",
            "200",
            "--count",
            "10",
            "--format",
            "ntp",
            "--tai-offset",
            str(offset_s),
            "--tlv",
            "200:0badcafe",
            "--tlv",
            "1:0000:0",
            "--tlv",
            "0x05:" + "00" * 12,
        )
    assert summary == {
        **summary,
        "sent": 10,
        "format": "ntp",
        "tai_offset_s": offset_s,
        "tlvs": 3,
        "length": 44 + 8 + 6 + 16,
    }
    pkts = udp_packets(pcap, 50014)
    assert len(pkts) == 10
    want_tlvs = bytes.fromhex("80c800040badcafe0001000200008005000c" + "00" * 12)
    kernel_offset = tai_minus_realtime_ns()
    for i, p in enumerate(pkts):
        payload = bytes(p[UDP].payload)
        assert payload[tp.STAMP_BASE_LEN :] == want_tlvs
        assert [(t.flags, t.type) for t in stlv.parse_tlvs(payload)] == [(0x80, 200), (0, 1), (0x80, 5)]
        pkt = tp.SenderPacket.decode(payload)
        assert pkt.seq == i and pkt.ssid == 14 and not pkt.err_est & tp.EE_Z
        captured_tai = int(p.time * 1_000_000_000) + kernel_offset
        t1 = ts.ntp_to_tai_ns(pkt.ts_sec, pkt.ts_frac, offset_s, captured_tai)
        assert 0 <= captured_tai - t1 < 5_000_000, (i, captured_tai - t1)
        # the same instant read as UTC: NTP seconds = TAI seconds - offset + 2208988800
        assert abs(pkt.ts_sec - ((captured_tai // 10**9) - offset_s + ts.NTP_UNIX_OFFSET)) <= 1


def test_sigterm_prints_summary(collectors_build, veth_pair):
    proc = subprocess.Popen(
        [
            str(collectors_build / "stamp_sender"),
            "--netns",
            veth_pair.snd_ns,
            "--src",
            veth_pair.snd_addr,
            "--dst",
            FINAL_DST,
            "--segs",
            SIDS[0],
            "--ssid",
            "12",
            "--rate",
            "100",
            "--duration",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=5)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert 50 <= s["sent"] <= 150 and s["last_seq"] == s["sent"] - 1 and s["duration_s"] < 5


_BASE = ["--src", "fd00::1", "--dst", "fc00::1", "--ssid", "1", "--rate", "10", "--count", "1"]


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--dst", "fc00::1", "--ssid", "1", "--rate", "10"], "--src"),  # missing --src (added below)
        (["--src", "fd00::1", "--dst", "nope", "--ssid", "1", "--rate", "10", "--count", "1"], "--dst"),
        (["--src", "fd00::1", "--dst", "fc00::1", "--ssid", "-1", "--rate", "10", "--count", "1"], "--ssid"),
        (["--src", "fd00::1", "--dst", "fc00::1", "--ssid", "70000", "--rate", "10", "--count", "1"], "--ssid"),
        (["--src", "fd00::1", "--dst", "fc00::1", "--ssid", "1", "--rate", "-5", "--count", "1"], "--rate"),
        (["--src", "fd00::1", "--dst", "fc00::1", "--ssid", "1", "--rate", "10"], "--count/--duration"),
        (
            [
                "--src",
                "fd00::1",
                "--dst",
                "fc00::1",
                "--segs",
                "fc00::2,bad",
                "--ssid",
                "1",
                "--rate",
                "10",
                "--count",
                "1",
            ],
            "--segs",
        ),
        (["--src", "fd00::1", "--dst", "fc00::1", "--ssid", "20000", "--rate", "10", "--count", "1"], "--sport"),
        (["--src", "fd00::1", "--dst", "fc00::1", "--ssid", "1", "--rate", "10", "--count", "1", "--bogus"], "--bogus"),
        (_BASE + ["--format", "tai"], "--format"),
        (_BASE + ["--tai-offset", "5000"], "--tai-offset"),
        (_BASE + ["--tlv", "300:00"], "--tlv"),
        (_BASE + ["--tlv", "1:abc"], "--tlv"),
        (_BASE + ["--tlv", "1:zz"], "--tlv"),
        (_BASE + ["--tlv", "1"], "--tlv"),
        (_BASE + ["--tlv", "1:00:0x100"], "--tlv"),
        (_BASE + ["--tlv", "1:" + "00" * 9000], "--tlv"),
        (_BASE + ["--tlv", "1:00", "--padding", "4"], "--padding"),
        (_BASE + ["--final-dst", "fc00::zz"], "--final-dst"),
        (_BASE + ["--segs", "fc00::2", "--final-dst", "fc00::3"], "--final-dst"),  # an SRH: the kernel's checksum
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(collectors_build, args, flag):
    res = subprocess.run([str(collectors_build / "stamp_sender"), *args], capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.startswith(f"stamp_sender: {flag}:"), res.stderr
    assert res.stdout == ""
