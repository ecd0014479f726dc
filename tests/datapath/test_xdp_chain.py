"""XDP chaining: altmark_rx and a STAMP program on the same device (one native XDP program each).

altmark_rx counts, then tail-calls slot 0 of its pinned prog array altmark_rx_next; a STAMP program
attached with `--behind altmark_rx` sits in that slot. Real programs on netlab line5
(H1–A–R–B–H2, prefix `chain`, override with SEGSCOPE_CHAIN_TEST_PREFIX):

- altmark_tx colours the monitored flow on A's a0 (A->B) and B's b0 (B->A); altmark_rx counts it on
  B's b0 and A's a0;
- the STAMP Session-Sender is a UDP socket on A (fc00:1::1, SRH via R), the reflector on B's b0 replies
  via R (return SIDs [fc00:2::e]), and the collector on A's a0 consumes the replies.

Checked: with the chain, the flow is counted exactly (tx == rx == sent, per colour) AND the STAMP
program does its work (replies field by field, its counters); detaching the chained program gives
altmark-only behaviour back (STAMP packets reach the stack); both orders of attaching work; the loaders'
errors name the command to run; without --behind/--chain
the loaders refuse a busy device as they always did.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from collectors.ustamp.netutil import srh_option
from segscope_schemas.stamp_test_packet import ReflectorPacket, ptp_to_ns
from tests.datapath.altmark_env import RX, TX, Receiver, expect_all, list_flows, retry_on_path_loss, send_udp
from tests.datapath.altmark_env import stats as am_stats
from tests.datapath.dp_env import (
    COLLECTOR,
    PIN_ROOT,
    REFLECTOR,
    recv_reply,
    run_tool,
    stamp_sender_payload,
    tai_ns,
    udp6_counter,
    udp_socket,
)

pytestmark = pytest.mark.datapath

PREFIX = os.environ.get("SEGSCOPE_CHAIN_TEST_PREFIX", "chain")
FWD_SIDS = "fc00:2::e,fc00:3::d6"  # A's policy to H2 (fd00:b::/64)
REV_SIDS = "fc00:2::e,fc00:1::d6"  # B's policy to H1 (fd00:a::/64)
FWD_FLOW, REV_FLOW = 11, 12
PERIOD_MS = 50  # short blocks: a round of 60 packets 3.5 ms apart sees both colours
SENDER_ADDR, REFLECTOR_ADDR, RETURN_SID = "fc00:1::1", "fc00:3::1", "fc00:2::e"
HOPS = 57


class ChainLab:
    def __init__(self, lab):
        self.lab = lab
        self.inst = {"A": f"{PREFIX}-A", "B": f"{PREFIX}-B"}
        self.dev = {"A": "a0", "B": "b0"}

    def ns(self, node: str) -> str:
        return self.lab.ns(node)

    def pin_dir(self, node: str, prog: str) -> Path:
        return PIN_ROOT / self.inst[node] / prog

    def where(self, node: str) -> list[str]:
        return ["--netns", self.ns(node), "--dev", self.dev[node]]

    def attach_rx(self, node: str) -> None:
        """altmark_rx on the node's SRv6 device, with the flow arriving there."""
        run_tool(RX, "attach", *self.where(node), "--instance", self.inst[node])
        sids, flow = (FWD_SIDS, FWD_FLOW) if node == "B" else (REV_SIDS, REV_FLOW)
        run_tool(
            RX,
            "add-flow",
            "--instance",
            self.inst[node],
            "--sids",
            sids,
            "--flow-id",
            str(flow),
            "--method",
            "dscp",
            "--period-ms",
            str(PERIOD_MS),
        )

    def detach_rx(self, node: str, check: bool = True):
        return run_tool(RX, "detach", *self.where(node), "--instance", self.inst[node], check=check)

    def stamp(self, node: str, *extra: str, check: bool = True):
        """attach the node's STAMP program (reflector on B, collector on A), extra e.g. --behind altmark_rx."""
        tool, prog = (REFLECTOR, "stamp_reflector") if node == "B" else (COLLECTOR, "stamp_collector")
        p = run_tool(tool, "attach", *self.where(node), "--pin-dir", str(self.pin_dir(node, prog)), *extra, check=check)
        if p.returncode == 0 and node == "B":
            d = str(self.pin_dir("B", "stamp_reflector"))
            run_tool(REFLECTOR, "add-address", "--pin-dir", d, REFLECTOR_ADDR)
            for ssid in (21, 22):
                run_tool(
                    REFLECTOR,
                    "add-session",
                    "--pin-dir",
                    d,
                    "--ssid",
                    str(ssid),
                    "--sender",
                    SENDER_ADDR,
                    "--return-sids",
                    RETURN_SID,
                )
        return p

    def unstamp(self, node: str, check: bool = True):
        tool, prog = (REFLECTOR, "stamp_reflector") if node == "B" else (COLLECTOR, "stamp_collector")
        return run_tool(tool, "detach", *self.where(node), "--pin-dir", str(self.pin_dir(node, prog)), check=check)

    def xdp_prog_name(self, node: str) -> str:
        out = self.lab.run(node, ["ip", "-j", "link", "show", "dev", self.dev[node]], check=True).stdout
        link = json.loads(out)[0]
        return link.get("xdp", {}).get("prog", {}).get("name", "")

    def chained_id(self, node: str) -> int | None:
        """The program id in altmark_rx_next of the node (None: empty)."""
        rows = bpftool("map", "dump", "pinned", str(self.pin_dir(node, "altmark_rx") / "altmark_rx_next"))
        if not rows:
            return None
        value = rows[0]["value"]  # hex bytes (the prog array has no BTF), little endian
        return int.from_bytes(bytes(int(b, 16) for b in value), "little") if isinstance(value, list) else value


def bpftool(*args: str):
    return json.loads(subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True, check=True).stdout)


@pytest.fixture(scope="module")
def chain(am_build):
    from netlab import Lab

    with Lab.up("netlab/topologies/line5.yaml", prefix=PREFIX) as lab:
        c = ChainLab(lab)
        for node, sids, flow in (("A", FWD_SIDS, FWD_FLOW), ("B", REV_SIDS, REV_FLOW)):
            run_tool(TX, "attach", *c.where(node), "--instance", c.inst[node])
            run_tool(
                TX,
                "add-flow",
                "--instance",
                c.inst[node],
                "--sids",
                sids,
                "--flow-id",
                str(flow),
                "--method",
                "dscp",
                "--period-ms",
                str(PERIOD_MS),
            )
        for node in ("A", "B"):
            c.attach_rx(node)
        lab.run("H1", ["ping", "-6", "-c", "1", "-W", "2", "fd00:b::1"])  # neighbours warm
        lab.run("H2", ["ping", "-6", "-c", "1", "-W", "2", "fd00:a::1"])
        try:
            yield c
        finally:
            for node in ("A", "B"):
                c.unstamp(node, check=False)
                c.detach_rx(node, check=False)
                run_tool(TX, "detach", *c.where(node), "--instance", c.inst[node], check=False)


# ---------------------------------------------------------------- altmark: exact counts


def flow_packets(tool: Path, inst: str) -> list[int]:
    """Packets per colour of the instance's only flow."""
    (flow,) = list_flows(tool, inst)
    return [flow["counters"][0]["packets"], flow["counters"][1]["packets"]]


def softnet_drops() -> int:
    """Packets the kernel dropped because a CPU's backlog was full (all namespaces: other users' load)."""
    rows = Path("/proc/net/softnet_stat").read_text().splitlines()
    return sum(int(r.split()[1], 16) for r in rows)


def check_altmark_exact(c: ChainLab, direction: str = "fwd", n: int = 60) -> None:
    """n datagrams over a monitored policy, across >= 2 colour periods: per colour, tx == rx, and the
    sums == n (every one delivered, else the whole measurement is repeated)."""
    src, dst, sink, tx_node, rx_node = (
        ("H1", "fd00:b::1", "H2", "A", "B") if direction == "fwd" else ("H2", "fd00:a::1", "H1", "B", "A")
    )

    def once() -> None:
        tx0, rx0 = flow_packets(TX, c.inst[tx_node]), flow_packets(RX, c.inst[rx_node])
        drops0 = softnet_drops()
        rx_stats0 = am_stats(RX, c.inst[rx_node])
        recv = Receiver(c.ns(sink))
        try:
            # gap: the n packets span > 4 colour periods (both colours counted)
            send_udp(c.ns(src), dst, n, cpus=[0, 1], gap_s=0.0035)
            got = recv.drain(n)
        finally:
            recv.close()
        tx = [a - b for a, b in zip(flow_packets(TX, c.inst[tx_node]), tx0)]
        rx = [a - b for a, b in zip(flow_packets(RX, c.inst[rx_node]), rx0)]
        expect_all(
            f"{direction} datagrams delivered (tx {tx}, rx {rx}, backlog drops {softnet_drops() - drops0})", len(got), n
        )
        assert tx == rx, (tx, rx)
        assert sum(tx) == n and min(tx) > 0, tx  # both colours seen
        assert am_stats(RX, c.inst[rx_node])["counted_dscp"] - rx_stats0["counted_dscp"] == n

    retry_on_path_loss(once, attempts=6)


# ---------------------------------------------------------------- STAMP


def stamp_sender(c: ChainLab, ssid: int) -> socket.socket:
    """Session-Sender on A: fc00:1::1 port 50000+ssid, to fc00:3::1 through R (SRH [fc00:2::e])."""
    s = udp_socket(c.ns("A"), SENDER_ADDR, 50000 + ssid)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, HOPS)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, srh_option(REFLECTOR_ADDR, [RETURN_SID]))
    return s


def send_stamp(sock: socket.socket, ssid: int, n: int, seq0: int = 0) -> list[int]:
    t1s = []
    for seq in range(seq0, seq0 + n):
        t1 = tai_ns()
        sock.sendto(stamp_sender_payload(seq, ssid, t1), (REFLECTOR_ADDR, 862))
        t1s.append(t1)
        time.sleep(0.001)
    return t1s


def drain(sock: socket.socket) -> None:
    """Drop late replies of an earlier attempt."""
    while not no_reply(sock, 0.05):
        pass


_seq_base = [0]


def next_seq0() -> int:
    """A fresh sequence range per round, so a late reply of a repeated round is never taken for one of this."""
    _seq_base[0] += 1000
    return _seq_base[0]


def reflect_round(c: ChainLab, sock: socket.socket, ssid: int, n: int) -> None:
    """n test packets from A; n replies come back through R to A's socket as the reflector wrote them,
    and its `reflected` counter moves by n. A packet lost outside the programs (a veth backlog
    overflow while the shared cores are busy) repeats the round; the checks are never loosened."""

    def once() -> None:
        drain(sock)
        before = refl_stats(c)["reflected"]
        seq0 = next_seq0()
        t1s = send_stamp(sock, ssid, n, seq0)
        got: set[int] = set()
        sock.settimeout(1.0)
        try:
            while len(got) < n:
                try:
                    data, peer, hop, rthdr = recv_reply(sock)
                except socket.timeout:
                    break
                t_recv = tai_ns()
                r = ReflectorPacket.decode(data[:44])
                assert r.ssid == ssid and r.seq == r.sender_seq and seq0 <= r.seq < seq0 + n, (r.seq, seq0)
                assert peer[:2] == (REFLECTOR_ADDR, 862)
                # hop limits: the sender's 57 minus R (End) on the way in; 255 minus R on the way back
                assert r.sender_ttl == HOPS - 1 and hop == 254
                assert rthdr is not None  # the return SRH the reflector wrote ([sender, fc00:2::e])
                t1 = t1s[r.seq - seq0]
                t2, t3 = ptp_to_ns(r.rx_sec, r.rx_frac, t_recv), ptp_to_ns(r.ts_sec, r.ts_frac, t_recv)
                assert t1 <= t2 <= t3 <= t_recv
                got.add(r.seq)
        finally:
            sock.settimeout(2.0)
        reflected = refl_stats(c)["reflected"] - before
        expect_all(f"STAMP replies (reflected {reflected})", len(got), n)
        assert reflected == n

    retry_on_path_loss(once)


def refl_stats(c: ChainLab) -> dict[str, int]:
    return json.loads(
        run_tool(REFLECTOR, "stats", "--pin-dir", str(c.pin_dir("B", "stamp_reflector")), "--json").stdout
    )


def no_reply(sock: socket.socket, wait_s: float = 0.3) -> bool:
    sock.settimeout(wait_s)
    try:
        recv_reply(sock)
    except socket.timeout:
        return True
    finally:
        sock.settimeout(2.0)
    return False


# ---------------------------------------------------------------- tests


def test_reflector_behind_altmark_rx(chain):
    c = chain
    check_altmark_exact(c)  # altmark only, as before
    p = c.stamp("B", "--behind", "altmark_rx")
    assert "chained behind altmark_rx on b0" in p.stdout
    assert c.xdp_prog_name("B") == "altmark_rx"  # the device still runs altmark_rx ...
    refl_id = bpftool("prog", "show", "pinned", str(c.pin_dir("B", "stamp_reflector") / "prog"))["id"]
    assert c.chained_id("B") == refl_id  # ... and the reflector in its slot
    try:
        before_rx = am_stats(RX, c.inst["B"])
        sock = stamp_sender(c, 21)
        reflect_round(c, sock, 21, 20)
        after_refl, after_rx = refl_stats(c), am_stats(RX, c.inst["B"])
        # altmark_rx saw them first: SRH [fc00:3::1, fc00:2::e] is not a monitored SID list
        assert after_rx["pass_unmonitored"] - before_rx["pass_unmonitored"] >= 20
        check_altmark_exact(c)  # and the flow is still counted exactly
        # all the flow's packets went through the reflector too: foreign traffic, passed by it
        assert refl_stats(c)["pass_not_local_addr"] - after_refl["pass_not_local_addr"] >= 60
    finally:
        p = c.unstamp("B")
    assert "removed from the chain" in p.stdout
    assert c.chained_id("B") is None and not c.pin_dir("B", "stamp_reflector").exists()

    # altmark-only again: STAMP packets reach B's stack (nobody listens on 862), no reply
    def to_stack() -> None:
        no_ports0 = udp6_counter(c.ns("B"), "Udp6NoPorts")
        send_stamp(sock, 21, 5, next_seq0())
        assert no_reply(sock)
        expect_all("STAMP packets at B's stack", udp6_counter(c.ns("B"), "Udp6NoPorts") - no_ports0, 5)

    retry_on_path_loss(to_stack)
    sock.close()
    check_altmark_exact(c)


def test_collector_behind_altmark_rx(chain):
    c = chain
    c.stamp("B", "--behind", "altmark_rx")  # reflector chained on B, collector on A
    coll = str(c.pin_dir("A", "stamp_collector"))
    try:
        p = c.stamp("A", "--behind", "altmark_rx")
        assert "chained behind altmark_rx on a0" in p.stdout
        assert c.xdp_prog_name("A") == "altmark_rx"
        run_tool(COLLECTOR, "activate", "--pin-dir", coll, "--ssid", "22", "--port", "50022")
        sock = stamp_sender(c, 22)

        def collect() -> None:
            run_tool(COLLECTOR, "dump", "--pin-dir", coll, "--timeout-ms", "50", check=False)  # stale ones
            before = json.loads(run_tool(COLLECTOR, "stats", "--pin-dir", coll, "--json").stdout)
            seq0 = next_seq0()
            t1s = send_stamp(sock, 22, 15, seq0)
            out = run_tool(
                COLLECTOR, "dump", "--pin-dir", coll, "--count", "15", "--timeout-ms", "2000", check=False
            ).stdout
            recs = [json.loads(line) for line in out.splitlines()]
            for r in recs:
                assert seq0 <= r["sender_seq"] < seq0 + 15 and r["ssid"] == 22
                t1 = t1s[r["sender_seq"] - seq0]
                assert r["t1_ns"] == t1 and t1 <= r["t2_ns"] <= r["t3_ns"] <= r["t4_ns"]
            assert len({r["sender_seq"] for r in recs}) == len(recs)  # one record each
            after = json.loads(run_tool(COLLECTOR, "stats", "--pin-dir", coll, "--json").stdout)
            assert after["collected"] - before["collected"] == len(recs)
            expect_all("STAMP records", len(recs), 15)

        retry_on_path_loss(collect)
        assert no_reply(sock)  # consumed in XDP behind altmark_rx
        check_altmark_exact(c, "rev")  # B->A flow counted exactly on A's a0
        check_altmark_exact(c, "fwd")
    finally:
        c.unstamp("A")
    assert c.chained_id("A") is None
    reflect_round(c, sock, 22, 3)  # collector gone: replies reach the socket
    sock.close()
    c.unstamp("B")
    check_altmark_exact(c, "rev")


def test_stamp_first_then_altmark_rx(chain):
    """The other order: the reflector is on b0 alone; altmark_rx attach --chain slots it behind
    itself (atomic swap), detach hands the device back to it. Without --chain: refused as before."""
    c = chain
    c.detach_rx("B")
    try:
        c.stamp("B")  # attached to b0 directly, as today
        assert c.xdp_prog_name("B") == "stamp_reflector"
        p = run_tool(RX, "attach", *c.where("B"), "--instance", c.inst["B"], check=False)
        assert p.returncode == 1 and "already runs stamp_reflector" in p.stderr and "add --chain" in p.stderr
        assert c.xdp_prog_name("B") == "stamp_reflector" and not c.pin_dir("B", "altmark_rx").exists()
        p = run_tool(RX, "attach", *c.where("B"), "--instance", c.inst["B"], "--chain")
        assert "stamp_reflector (already on b0) now runs behind altmark_rx" in p.stdout
        run_tool(
            RX,
            "add-flow",
            "--instance",
            c.inst["B"],
            "--sids",
            FWD_SIDS,
            "--flow-id",
            str(FWD_FLOW),
            "--method",
            "dscp",
            "--period-ms",
            str(PERIOD_MS),
        )
        assert c.xdp_prog_name("B") == "altmark_rx" and c.chained_id("B")
        sock = stamp_sender(c, 21)
        reflect_round(c, sock, 21, 10)
        check_altmark_exact(c)
        # altmark_rx leaves: the reflector gets b0 back and keeps reflecting
        p = c.detach_rx("B")
        assert "now attached to b0 directly" in p.stdout
        assert c.xdp_prog_name("B") == "stamp_reflector"
        reflect_round(c, sock, 21, 5)
        sock.close()
    finally:
        c.unstamp("B", check=False)
        if c.xdp_prog_name("B") != "altmark_rx":
            c.attach_rx("B")


def test_errors_name_the_command(chain):
    c = chain
    # no altmark_rx on A's ah: says which attach to run
    c.detach_rx("A")
    try:
        p = c.stamp("A", "--behind", "altmark_rx", check=False)
        assert p.returncode == 1
        assert f"run `altmark_rx attach --dev a0 --instance {c.inst['A']} --netns {c.ns('A')}` first" in p.stderr
        assert not c.pin_dir("A", "stamp_collector").exists()  # nothing left behind
    finally:
        c.attach_rx("A")
    # a bad --behind is a usage error; --chain is altmark_rx's only
    p = c.stamp("A", "--behind", "altmark_tx", check=False)
    assert p.returncode == 2 and "--behind: expected altmark_rx" in p.stderr
    p = run_tool(TX, "attach", *c.where("A"), "--instance", c.inst["A"], "--chain", check=False)
    assert p.returncode == 2 and "--chain: only altmark_rx" in p.stderr
    # the STAMP program without --behind on altmark_rx's device: refused as before, with the flag to add
    p = c.stamp("A", check=False)
    assert p.returncode == 1 and "add --behind altmark_rx" in p.stderr
    assert not c.pin_dir("A", "stamp_collector").exists() and c.xdp_prog_name("A") == "altmark_rx"
    # one program per slot: the second is refused, naming the first
    c.stamp("B", "--behind", "altmark_rx")
    try:
        p = run_tool(
            COLLECTOR,
            "attach",
            *c.where("B"),
            "--pin-dir",
            str(c.pin_dir("B", "stamp_collector")),
            "--behind",
            "altmark_rx",
            check=False,
        )
        assert p.returncode == 1 and "already holds program" in p.stderr and "(stamp_reflector)" in p.stderr
        assert not c.pin_dir("B", "stamp_collector").exists()
    finally:
        c.unstamp("B")


def test_tail_call_in_test_run(am_build):
    """BPF_PROG_TEST_RUN of altmark_rx on a scratch veth (no lab traffic in the counters): an empty slot
    passes, a chained reflector's verdict and rewritten frame come out of altmark_rx's run, and
    altmark_rx counts either way. Prints ns/packet (-s) of altmark_rx alone vs chained."""
    from tests.datapath.altmark_env import POLICY, TestRun, encapped
    from tests.datapath.dp_env import eth_ipv6, parse_frame, udp_datagram

    ns, inst = f"{PREFIX}tr", f"{PREFIX}tr"
    rx_dir, refl_dir = PIN_ROOT / inst / "altmark_rx", PIN_ROOT / inst / "stamp_reflector"
    where = ["--netns", ns, "--dev", f"{PREFIX}tr0"]
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(
            ["ip", "-n", ns, "link", "add", f"{PREFIX}tr0", "type", "veth", "peer", "name", f"{PREFIX}tr1"], check=True
        )
        run_tool(RX, "attach", *where, "--instance", inst)
        run_tool(
            RX,
            "add-flow",
            "--instance",
            inst,
            "--sids",
            ",".join(POLICY),
            "--flow-id",
            "1",
            "--method",
            "dscp",
            "--period-ms",
            "1000",
        )
        monitored = encapped(POLICY, tclass=0x04)  # colour 1
        stamp = eth_ipv6(
            SENDER_ADDR,
            REFLECTOR_ADDR,
            17,
            udp_datagram(SENDER_ADDR, REFLECTOR_ADDR, 50021, 862, stamp_sender_payload(1, 21, 10**18)),
        )
        rx = TestRun(rx_dir / "prog")
        XDP_PASS, XDP_TX = 2, 3

        s0 = am_stats(RX, inst)
        assert rx.run(monitored)[0] == XDP_PASS and rx.run(stamp)[0] == XDP_PASS  # empty slot: as before
        assert {k: v - s0[k] for k, v in am_stats(RX, inst).items() if v != s0[k]} == {
            "counted_dscp": 1,
            "pass_no_srh": 1,
        }
        alone = min(rx.run(monitored, repeat=20_000)[2] for _ in range(3))

        run_tool(REFLECTOR, "attach", *where, "--pin-dir", str(refl_dir), "--behind", "altmark_rx")
        run_tool(REFLECTOR, "add-address", "--pin-dir", str(refl_dir), REFLECTOR_ADDR)
        run_tool(REFLECTOR, "add-session", "--pin-dir", str(refl_dir), "--ssid", "21")
        s1, r1 = am_stats(RX, inst), refl_stats_at(refl_dir)
        verdict, out, _ = rx.run(stamp)
        assert verdict == XDP_TX  # the reflector's verdict ...
        reply = parse_frame(out)  # ... and its reply frame
        assert (reply.src, reply.dst, reply.sport, reply.dport) == (REFLECTOR_ADDR, SENDER_ADDR, 862, 50021)
        assert rx.run(monitored)[0] == XDP_PASS  # foreign to the reflector: passed
        assert {k: v - s1[k] for k, v in am_stats(RX, inst).items() if v != s1[k]} == {
            "counted_dscp": 1,
            "pass_no_srh": 1,
        }  # altmark_rx counted both first
        r2 = refl_stats_at(refl_dir)
        assert {k: v - r1[k] for k, v in r2.items() if v != r1[k]} == {"reflected": 1, "pass_not_local_addr": 1}
        chained = min(rx.run(monitored, repeat=20_000)[2] for _ in range(3))
        print(
            f"\naltmark_rx on a monitored dscp packet: {alone} ns alone (empty slot), {chained} ns chained "
            f"into the reflector (which passes it)"
        )
        run_tool(REFLECTOR, "detach", *where, "--pin-dir", str(refl_dir))
        assert rx.run(stamp)[0] == XDP_PASS  # slot emptied: altmark-only again
    finally:
        run_tool(REFLECTOR, "detach", *where, "--pin-dir", str(refl_dir), check=False)
        run_tool(RX, "detach", *where, "--instance", inst, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def refl_stats_at(pin_dir: Path) -> dict[str, int]:
    return json.loads(run_tool(REFLECTOR, "stats", "--pin-dir", str(pin_dir), "--json").stdout)
