"""The XDP chain (datapath/xdp_chain.h, datapath/README.md "Chaining"): every XDP program of a node
on any of its devices, in any combination and any order of attach and detach.

On netlab fork3 (P1 —p1/b1— B —b2/p2— P2, prefix `xch`, override with SEGSCOPE_CHAIN_TEST_PREFIX)
the members of MEMBERS join and leave B's two devices in three orders. After every step P1 and
P2 each send, over their own link, packets of three kinds: a monitored flow (UDP with an SRH,
both colours), STAMP test packets to B's reflector address and STAMP replies to B's sender
port. What must happen follows from the members on each device, in role order, alone: each
counts every packet it sees in exactly one counter and passes it on, or consumes it (the
reflector answers a test packet, the collector collects a reply); what no member consumes
reaches B's stack (no listener: Udp6NoPorts). Checked exactly, per program and per device:
the stats counters, the replies P1/P2 receive (field by field), the collector's records, the
flow's per-colour counters, B's Udp6NoPorts, the chain the loaders report, and that the
dispatcher is on a device exactly while a member is. A role is one line of MEMBERS.

Also BPF_PROG_TEST_RUN through the dispatcher (a member's verdict and rewritten frame come out
of the dispatcher's run, STAMP packets with a Hop-by-Hop header are counted and passed on), the
loaders' refusals, and concurrent loaders of one instance.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from collectors.ustamp.netutil import srh_option
from segscope_schemas.stamp_test_packet import ReflectorPacket, ptp_to_ns
from tests.datapath.altmark_env import (
    POLICY,
    encapped,
    expect_all,
    iface_counter,
    ioam_hbh,
    retry_on_path_loss,
)
from tests.datapath.altmark_env import (
    TestRun as PinnedTestRun,
)
from tests.datapath.chain_env import (
    XDP_DROP,
    XDP_PASS,
    XDP_TX,
    DispatcherRun,
    chain_of,
    prog_id,
    role_order,
    xdp_program,
)
from tests.datapath.dp_env import (
    BUILD,
    PIN_ROOT,
    eth_ipv6,
    parse_frame,
    recv_reply,
    run_tool,
    stamp_sender_payload,
    tai_ns,
    udp6_counter,
    udp_datagram,
    udp_socket,
)
from tests.isolation import own_name

pytestmark = pytest.mark.datapath

PREFIX = os.environ.get("SEGSCOPE_CHAIN_TEST_PREFIX") or own_name("xch")
DEVS = ("b1", "b2")
PEER = {"b1": ("P1", "fd00:31::1"), "b2": ("P2", "fd00:32::1")}  # who sends over which device of B
REFLECTOR_ADDR, SENDER_ADDR, FLOW_DST = "fc00:3::1", "fc00:3::2", "fc00:3::f"  # on B's loopback
TEST_SSID, REPLY_SSID, SENDER_PORT, FLOW_PORT = 21, 22, 50022, 9000
HOPS = 50
# packets per round and device, different everywhere: one counted on the wrong device shows
SENT = {
    "b1": {"flow0": 3, "flow1": 4, "test": 5, "reply": 6},
    "b2": {"flow0": 4, "flow1": 2, "test": 3, "reply": 5},
}


# ---------------------------------------------------------------- the members


def _altmark_setup(fork: "Fork") -> None:
    fork.member_run("altmark_rx", "add-flow", "--sids", FLOW_DST, "--flow-id", "7", "--method", "dscp",
                    "--period-ms", "1000")  # fmt: skip


def _ioam_setup(fork: "Fork") -> None:
    fork.member_run("ioam_rx", "add-flow", "--sids", FLOW_DST, "--flow-id", "7", "--namespace-id", "1")


def _collector_setup(fork: "Fork") -> None:
    fork.member_run("stamp_collector", "activate", "--ssid", str(REPLY_SSID), "--port", str(SENDER_PORT))


def _reflector_setup(fork: "Fork") -> None:
    fork.member_run("stamp_reflector", "add-address", REFLECTOR_ADDR)
    fork.member_run("stamp_reflector", "add-session", "--ssid", str(TEST_SSID))


@dataclass(frozen=True)
class Member:
    """A role of the chain as these tests drive it: how its loader names the instance, what it needs
    after its first attach, and its verdict on each kind of packet the test sends: (the one stats
    counter the packet lands in, whether the member consumes it)."""

    role: str  # xdp_chain.h role name = loader = pin directory
    by_instance: bool  # --instance NAME (alternate-marking loaders) or --pin-dir DIR (STAMP)
    setup: Callable[["Fork"], None]
    verdicts: dict[str, tuple[str, bool]]
    attach_args: tuple[str, ...] = ()  # what its loader's attach needs besides device and names


MEMBERS = sorted(
    [
        Member("altmark_rx", True, _altmark_setup,
               {"flow": ("counted_dscp", False), "test": ("pass_no_srh", False), "reply": ("pass_no_srh", False)}),
        Member("ioam_rx", True, _ioam_setup,
               {"flow": ("pass_no_hbh", False), "test": ("pass_no_hbh", False), "reply": ("pass_no_hbh", False)},
               ("--node-id", "3")),
        Member("stamp_collector", False, _collector_setup,
               {"flow": ("pass_not_stamp_reply", False), "test": ("pass_not_stamp_reply", False),
                "reply": ("collected", True)}),
        Member("stamp_reflector", False, _reflector_setup,
               {"flow": ("pass_not_local_addr", False), "test": ("reflected", True),
                "reply": ("pass_not_local_addr", False)}),
    ],
    key=lambda m: role_order().index(m.role),
)  # fmt: skip
BY_ROLE = {m.role: m for m in MEMBERS}
A, I, C, R = "altmark_rx", "ioam_rx", "stamp_collector", "stamp_reflector"


class Fork:
    """B of the fork3 lab and its instance's members."""

    def __init__(self, lab):
        self.lab = lab
        self.ns = lab.ns("B")
        self.inst = f"{PREFIX}-B"
        self.on: dict[str, set[str]] = {m.role: set() for m in MEMBERS}  # role -> devices it runs on

    def pin(self, role: str) -> Path:
        return PIN_ROOT / self.inst / role

    def names(self, role: str) -> list[str]:
        return ["--instance", self.inst] if BY_ROLE[role].by_instance else ["--pin-dir", str(self.pin(role))]

    def loader(self, role: str, cmd: str, dev: str, check: bool = True) -> subprocess.CompletedProcess:
        extra = BY_ROLE[role].attach_args if cmd == "attach" else ()
        return run_tool(BUILD / role, cmd, "--netns", self.ns, "--dev", dev, *self.names(role), *extra, check=check)

    def member_run(self, role: str, cmd: str, *args: str) -> subprocess.CompletedProcess:
        return run_tool(BUILD / role, cmd, *self.names(role), *args)

    def join(self, role: str, dev: str) -> None:
        first = not self.on[role]
        self.loader(role, "attach" if first else "attach-dev", dev)
        if first:
            BY_ROLE[role].setup(self)
        self.on[role].add(dev)

    def leave(self, role: str, dev: str) -> None:
        """detach-dev while the member runs on another device too, else detach (pins go)."""
        last = self.on[role] == {dev}
        self.loader(role, "detach" if last else "detach-dev", dev)
        self.on[role].discard(dev)
        assert self.pin(role).exists() != last

    def leave_all(self, role: str) -> None:
        """`detach` on one device takes the member off every device it runs on."""
        p = self.loader(role, "detach", sorted(self.on[role])[0])
        for dev in sorted(self.on[role])[1:]:
            assert f"{role} also left {dev}" in p.stdout
        self.on[role] = set()
        assert not self.pin(role).exists()

    def state(self) -> dict[str, list[str]]:
        """device -> the roles on it, in the order a packet visits them."""
        return {d: [m.role for m in MEMBERS if d in self.on[m.role]] for d in DEVS}

    def stats(self, role: str) -> dict[str, int]:
        return json.loads(self.member_run(role, "stats", "--json").stdout)


@pytest.fixture(scope="module")
def fork(datapath_build):
    from netlab import Lab

    with Lab.up("netlab/topologies/fork3.yaml", prefix=PREFIX) as lab:
        f = Fork(lab)
        time.sleep(1.0)  # let the address setup's MLD reports pass before counting packets
        try:
            yield f
        finally:
            for m in reversed(MEMBERS):
                if f.on[m.role]:
                    f.loader(m.role, "detach", sorted(f.on[m.role])[0], check=False)


# ---------------------------------------------------------------- traffic and its ground truth


class Peers:
    """The sockets of P1 and P2: flow (with an SRH, both colours), STAMP test packets (and their
    replies from B's reflector), STAMP replies to B's Session-Sender port."""

    def __init__(self, fork: Fork):
        self.flow, self.test, self.reply = {}, {}, {}
        for dev, (node, addr) in PEER.items():
            ns = fork.lab.ns(node)
            self.flow[dev] = udp_socket(ns, addr, 40000)
            self.flow[dev].setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RTHDR, srh_option(FLOW_DST, []))
            self.test[dev] = udp_socket(ns, addr, 50000 + TEST_SSID)
            self.test[dev].setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, HOPS)
            self.reply[dev] = udp_socket(ns, addr, 862)
        self.seq = 0

    def close(self) -> None:
        for group in (self.flow, self.test, self.reply):
            for s in group.values():
                s.close()

    def send(self, dev: str, sent: dict[str, int]) -> dict:
        """Send one round over dev; returns what was sent that the answers must match."""
        self.seq += 1000
        out = {"t1": {}, "replies": {}}
        for colour in (0, 1):
            self.flow[dev].setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, 0x04 * colour)
            for _ in range(sent[f"flow{colour}"]):
                self.flow[dev].sendto(b"f" * 64, (FLOW_DST, FLOW_PORT))
                time.sleep(0.0005)
        for i in range(sent["test"]):
            seq = self.seq + i
            out["t1"][seq] = tai_ns()
            self.test[dev].sendto(stamp_sender_payload(seq, TEST_SSID, out["t1"][seq]), (REFLECTOR_ADDR, 862))
            time.sleep(0.0005)
        for i in range(sent["reply"]):
            seq = self.seq + 500 + i
            t1 = tai_ns() - 3_000_000
            r = ReflectorPacket(seq, (t1 // 10**9) + 1, 2000, 0x8001, REPLY_SSID, t1 // 10**9 + 1, 1000, seq,
                                t1 // 10**9, t1 % 10**9, 0x8001, 63)  # fmt: skip
            out["replies"][seq] = (t1 // 10**9) * 10**9 + t1 % 10**9
            self.reply[dev].sendto(r.encode(), (SENDER_ADDR, SENDER_PORT))
            time.sleep(0.0005)
        return out

    def replies(self, dev: str, want: int, wait_s: float) -> list[tuple[ReflectorPacket, tuple, int]]:
        got = []
        sock = self.test[dev]
        end = time.monotonic() + wait_s
        while time.monotonic() < end and (len(got) < want or want == 0):
            sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                data, peer, hop, _rthdr = recv_reply(sock)
            except socket.timeout:
                break
            got.append((ReflectorPacket.decode(data[:44]), peer, hop))
        return got


def expected(state: dict[str, list[str]]) -> dict:
    """What the round must produce, from the members on each device in role order alone."""
    counters = {m.role: Counter() for m in MEMBERS}
    out = {"counters": counters, "stack": 0, "replies": {}, "records": 0, "flow": [0, 0]}
    for dev, sent in SENT.items():
        out["replies"][dev] = 0
        for kind, n in sent.items():
            base = kind.rstrip("01")
            for role in state[dev]:
                counter, consumed = BY_ROLE[role].verdicts[base]
                counters[role][counter] += n
                if counter == "counted_dscp":
                    out["flow"][int(kind[-1])] += n
                if consumed:
                    out["replies"][dev] += n if counter == "reflected" else 0
                    out["records"] += n if counter == "collected" else 0
                    break
            else:
                out["stack"] += n
    return out


def flow_packets(fork: Fork) -> list[int]:
    if not fork.on["altmark_rx"]:
        return [0, 0]
    flows = json.loads(fork.member_run("altmark_rx", "list-flows", "--json").stdout)["flows"]
    return [c["packets"] for c in flows[0]["counters"]]


def check_round(fork: Fork, peers: Peers) -> None:
    """One round of traffic over both devices against the current chain; exact. A packet the kernel
    drops outside the programs (a veth backlog under other load: the device's rx count says so)
    repeats the round, never loosens it."""
    state = fork.state()
    want = expected(state)
    pinned = [m.role for m in MEMBERS if fork.on[m.role]]

    def once() -> None:
        if fork.on["stamp_collector"]:  # records of an earlier attempt
            fork.member_run("stamp_collector", "dump", "--timeout-ms", "50")
        for dev in DEVS:
            while peers.replies(dev, 0, 0.02):
                pass
        before = {role: fork.stats(role) for role in pinned}
        rx0 = {d: iface_counter(fork.ns, d, "rx_packets") for d in DEVS}
        no_ports0, flow0 = udp6_counter(fork.ns, "Udp6NoPorts"), flow_packets(fork)
        sent = {dev: peers.send(dev, SENT[dev]) for dev in DEVS}
        replies = {dev: peers.replies(dev, want["replies"][dev], 1.5 if want["replies"][dev] else 0.2) for dev in DEVS}
        time.sleep(0.1)
        rx = {d: iface_counter(fork.ns, d, "rx_packets") - rx0[d] for d in DEVS}
        for dev in DEVS:  # every packet sent reached B's device, and nothing else did
            expect_all(f"packets received on {dev}", rx[dev], sum(SENT[dev].values()))
        records = []
        if fork.on["stamp_collector"]:
            out = run_tool(BUILD / "stamp_collector", "dump", *fork.names("stamp_collector"), "--count",
                           str(want["records"]), "--timeout-ms", "1000", check=False).stdout  # fmt: skip
            records = [json.loads(line) for line in out.splitlines()]
        got = {
            role: {k: v - before[role][k] for k, v in fork.stats(role).items() if v != before[role][k]}
            for role in pinned
        }
        for dev in DEVS:
            expect_all(
                f"STAMP replies on {dev} ({got.get('stamp_reflector')})", len(replies[dev]), want["replies"][dev]
            )
        expect_all(f"collector records ({got.get('stamp_collector')})", len(records), want["records"])
        # every packet in exactly one counter of each program, the one its role gives it
        assert got == {role: dict(want["counters"][role]) for role in pinned}, (state, got)
        assert udp6_counter(fork.ns, "Udp6NoPorts") - no_ports0 == want["stack"], state
        assert [a - b for a, b in zip(flow_packets(fork), flow0)] == want["flow"], state
        for dev in DEVS:  # the reflector's answers, field by field
            t_recv = tai_ns()
            assert {r.sender_seq for r, _, _ in replies[dev]} == (set(sent[dev]["t1"]) if R in state[dev] else set())
            for r, peer, hop in replies[dev]:
                t1 = sent[dev]["t1"][r.sender_seq]
                assert (r.ssid, r.seq, peer[:2], hop) == (TEST_SSID, r.sender_seq, (REFLECTOR_ADDR, 862), 255)
                assert r.sender_ttl == HOPS
                assert t1 <= ptp_to_ns(r.rx_sec, r.rx_frac, t_recv) <= ptp_to_ns(r.ts_sec, r.ts_frac, t_recv) <= t_recv
        # the collector's records: one per reply sent to a device it runs on, with that reply's T1
        collected = {seq: (dev, t1) for dev in DEVS if C in state[dev] for seq, t1 in sent[dev]["replies"].items()}
        assert sorted(r["sender_seq"] for r in records) == sorted(collected)
        for r in records:
            dev, t1 = collected[r["sender_seq"]]
            assert (r["ssid"], r["t1_ns"], r["ifindex"]) == (REPLY_SSID, t1, fork.lab.ifindex("B", dev)), r

    retry_on_path_loss(once, attempts=5)


def check_chain(fork: Fork) -> None:
    """The loaders' view of the chain and the devices' XDP program follow the members exactly."""
    state = fork.state()
    ids = {m.role: prog_id(fork.pin(m.role) / "prog") for m in MEMBERS if fork.on[m.role]}
    shown = chain_of(fork.ns, fork.inst)
    assert {dev: [(e["role"], e["id"]) for e in members] for dev, members in shown.items()} == {
        dev: [(role, ids[role]) for role in roles] for dev, roles in state.items() if roles
    }
    for dev, roles in state.items():
        assert xdp_program(fork.ns, dev) == ("xdp_chain" if roles else None), (dev, roles)
    assert (PIN_ROOT / fork.inst / "xdp_chain").exists() == any(state.values())


# ---------------------------------------------------------------- (a) every combination, several orders

SEQUENCES = {
    # role order, device by device; the first member leaves first
    "in_role_order": [("+", A, "b1"), ("+", C, "b1"), ("+", R, "b1"), ("+", A, "b2"), ("+", C, "b2"),
                      ("+", R, "b2"), ("-", A, "b1"), ("-", C, "b1"), ("-", R, "b1"), ("-", A, "b2"),
                      ("-", C, "b2"), ("-", R, "b2")],
    # reverse role order, devices interleaved; the middle member leaves first
    "reverse_interleaved": [("+", R, "b2"), ("+", R, "b1"), ("+", C, "b2"), ("+", C, "b1"), ("+", A, "b2"),
                            ("+", A, "b1"), ("-", C, "b1"), ("-", C, "b2"), ("-", A, "b2"), ("-", R, "b1"),
                            ("x", R, ""), ("-", A, "b1")],
    # members alone and in pairs; `detach` of a member on both devices at once
    "mixed": [("+", C, "b1"), ("+", C, "b2"), ("+", A, "b2"), ("+", R, "b1"), ("x", C, ""), ("-", R, "b1"),
              ("+", A, "b1"), ("x", A, "")],
}  # fmt: skip


def _gray_walk() -> list[tuple[str, str, str]]:
    """Every subset of MEMBERS on each device, one join or leave per step: a reflected Gray code
    over the roles, b1 in role order and b2 in reverse role order, the devices' steps interleaved,
    then the members still on a device leave."""
    roles = [m.role for m in MEMBERS]
    steps: list[tuple[str, str, str]] = []
    on: dict[str, set[str]] = {d: set() for d in DEVS}
    for k in range(1, 1 << len(roles)):
        bit = (k & -k).bit_length() - 1  # the bit the Gray code flips at step k
        for dev, order in (("b1", roles), ("b2", roles[::-1])):
            role = order[bit]
            steps.append(("-" if role in on[dev] else "+", role, dev))
            on[dev] ^= {role}
    steps += [("-", role, dev) for dev in DEVS for role in sorted(on[dev])]
    return steps


SEQUENCES["gray"] = _gray_walk()
SEEN: dict[str, set[tuple[str, ...]]] = {d: set() for d in DEVS}


@pytest.mark.parametrize("order", list(SEQUENCES))
def test_every_member_combination_on_both_devices(fork, order):
    peers = Peers(fork)
    try:
        check_chain(fork)
        check_round(fork, peers)
        for op, role, dev in SEQUENCES[order]:
            {"+": fork.join, "-": fork.leave}[op](role, dev) if op != "x" else fork.leave_all(role)
            check_chain(fork)
            check_round(fork, peers)
            for d, roles in fork.state().items():
                SEEN[d].add(tuple(roles))
        assert fork.state() == {d: [] for d in DEVS}
        assert not (PIN_ROOT / fork.inst).exists()  # the chain's pins went with its last device
    finally:
        peers.close()


def test_every_subset_of_members_ran_on_each_device(fork):
    """The orders above put every subset of the members on each device at some step."""
    if any(not SEEN[d] for d in DEVS):
        pytest.skip("needs test_every_member_combination_on_both_devices in the same session")
    roles = [m.role for m in MEMBERS]
    subsets = {tuple(r for i, r in enumerate(roles) if mask >> i & 1) for mask in range(1 << len(roles))}
    for dev in DEVS:
        assert SEEN[dev] | {()} >= subsets, (dev, subsets - SEEN[dev])


# ---------------------------------------------------------------- refusals and concurrency


def test_refusals_name_what_is_there(fork):
    f = fork
    f.join(R, "b1")
    try:
        refl = prog_id(f.pin(R) / "prog")
        # a role's slot holds one program per device
        p = f.loader(R, "attach-dev", "b1", check=False)
        assert p.returncode == 1 and f"b1 already runs stamp_reflector (program {refl})" in p.stderr, p.stderr
        # a device running another XDP program is not taken over: named, nothing left behind
        f.lab.run("B", ["ip", "link", "set", "dev", "b2", "xdpdrv", "obj", "build/netlab/xdp_pass.bpf.o", "sec", "xdp"],
                  check=True)  # fmt: skip
        try:
            other = json.loads(f.lab.run("B", ["ip", "-j", "link", "show", "dev", "b2"], check=True).stdout)[0]["xdp"][
                "prog"
            ]["id"]
            for role in (A, C):
                p = f.loader(role, "attach", "b2", check=False)
                assert p.returncode == 1 and f"b2 runs program {other} (xdp_pass), not the XDP chain" in p.stderr
                assert not f.pin(role).exists()
            p = f.loader(R, "attach-dev", "b2", check=False)
            assert p.returncode == 1 and f"program {other} (xdp_pass)" in p.stderr
        finally:
            f.lab.run("B", ["ip", "link", "set", "dev", "b2", "xdpdrv", "off"], check=True)
        # another instance's chain on b1 is another program too
        other_pin = PIN_ROOT / f"{PREFIX}-Bx" / "stamp_collector"
        p = run_tool(BUILD / C, "attach", "--netns", f.ns, "--dev", "b1", "--pin-dir", str(other_pin), check=False)
        assert p.returncode == 1 and "(xdp_chain), not the XDP chain of" in p.stderr, p.stderr
        assert not other_pin.parent.exists()
        # leaving where the member does not run
        p = f.loader(R, "detach-dev", "b2", check=False)
        assert p.returncode == 1 and "b2 is not in the XDP chain" in p.stderr
        f.join(A, "b2")
        p = f.loader(R, "detach-dev", "b2", check=False)
        assert p.returncode == 1 and "no stamp_reflector runs on b2" in p.stderr
        check_chain(f)
    finally:
        for role in (A, R):
            if f.on[role]:
                f.leave_all(role)
    check_chain(f)
    # bad arguments name the flag (exit 2); the old chaining options are gone
    p = run_tool(BUILD / R, "attach", "--netns", f.ns, "--pin-dir", str(f.pin(R)), check=False)
    assert p.returncode == 2 and "missing required --dev" in p.stderr
    p = run_tool(BUILD / R, "attach", "--netns", f.ns, "--dev", "b1", "--pin-dir", str(f.pin(R)), "--behind",
                 "altmark_rx", check=False)  # fmt: skip
    assert p.returncode == 2 and not f.pin(R).exists()
    p = run_tool(BUILD / A, "attach", "--netns", f.ns, "--dev", "b1", "--instance", f.inst, "--chain", check=False)
    assert p.returncode == 2 and not f.pin(A).exists()
    p = run_tool(BUILD / "altmark_tx", "chain", "--instance", f.inst, check=False)
    assert p.returncode == 2 and "altmark_tx is a TC program" in p.stderr
    p = run_tool(BUILD / R, "chain", "--netns", f"{PREFIX}-nope", "--pin-dir", str(f.pin(R)), check=False)
    assert p.returncode == 1 and "--netns" in p.stderr
    assert chain_of(f.ns, f.inst) == {}


def test_concurrent_loaders_of_one_instance(fork):
    """Loaders of one instance started at the same moment wait for each other (the chain's lock):
    every attach and every detach succeeds, and the chain is whole in between."""
    f = fork

    def start(cmd: str, role: str, dev: str) -> subprocess.Popen:
        extra = BY_ROLE[role].attach_args if cmd == "attach" else ()
        return subprocess.Popen([str(BUILD / role), cmd, "--netns", f.ns, "--dev", dev, *f.names(role), *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

    procs = [start("attach", m.role, "b1") for m in MEMBERS]
    assert [p.wait() for p in procs] == [0] * len(procs), [p.stderr.read() for p in procs]
    for m in MEMBERS:
        f.on[m.role].add("b1")
        m.setup(f)
    procs = [start("attach-dev", m.role, "b2") for m in MEMBERS]
    assert [p.wait() for p in procs] == [0] * len(procs), [p.stderr.read() for p in procs]
    for m in MEMBERS:
        f.on[m.role].add("b2")
    check_chain(f)
    peers = Peers(f)
    try:
        check_round(f, peers)
    finally:
        peers.close()
    procs = [start("detach", m.role, "b1") for m in MEMBERS]
    assert [p.wait() for p in procs] == [0] * len(procs), [p.stderr.read() for p in procs]
    for m in MEMBERS:
        f.on[m.role] = set()
    check_chain(f)
    assert not (PIN_ROOT / f.inst).exists()


# ---------------------------------------------------------------- (b) BPF_PROG_TEST_RUN through the dispatcher


@pytest.fixture
def scratch(datapath_build):
    """Two veths in a throwaway netns (up, no IPv6: nothing of their own reaches the counters)."""
    ns = inst = f"{PREFIX}tr"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    for cmd in (
        ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
        ["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
        ["ip", "link", "add", f"{ns}0", "type", "veth", "peer", "name", f"{ns}1"],
        ["ip", "link", "set", f"{ns}0", "up"],
        ["ip", "link", "set", f"{ns}1", "up"],
    ):
        subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True)
    ifindex = {
        d: int(
            subprocess.run(
                ["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{d}/ifindex"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )  # fmt: skip
        for d in (f"{ns}0", f"{ns}1")
    }
    try:
        yield ns, inst, ifindex
    finally:
        for role in role_order()[::-1]:
            if (PIN_ROOT / inst / role).exists():
                args = (
                    ["--instance", inst] if role.startswith("altmark") else ["--pin-dir", str(PIN_ROOT / inst / role)]
                )
                run_tool(BUILD / role, "detach", "--netns", ns, "--dev", f"{ns}0", *args, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _stamp_test_frame(hbh: bool = False) -> bytes:
    udp = udp_datagram("fd00:31::1", REFLECTOR_ADDR, 50021, 862, stamp_sender_payload(7, TEST_SSID, 10**18))
    return eth_ipv6("fd00:31::1", REFLECTOR_ADDR, 0 if hbh else 17, (ioam_hbh(17) if hbh else b"") + udp)


def _stamp_reply_frame(hbh: bool = False) -> bytes:
    r = ReflectorPacket(
        9, 1_700_000_001, 2000, 0x8001, REPLY_SSID, 1_700_000_001, 1000, 9, 1_700_000_000, 5, 0x8001, 63
    )
    udp = udp_datagram("fd00:31::1", SENDER_ADDR, 862, SENDER_PORT, r.encode())
    return eth_ipv6("fd00:31::1", SENDER_ADDR, 0 if hbh else 17, (ioam_hbh(17) if hbh else b"") + udp)


def test_members_verdicts_come_out_of_the_dispatcher(scratch):
    ns, inst, ifindex = scratch
    dev0, dev1 = f"{ns}0", f"{ns}1"
    refl, coll = PIN_ROOT / inst / R, PIN_ROOT / inst / C
    amrx = ["--instance", inst]

    def stats(role: str) -> dict[str, int]:
        args = amrx if role == A else ["--pin-dir", str(PIN_ROOT / inst / role)]
        return json.loads(run_tool(BUILD / role, "stats", *args, "--json").stdout)

    def moved(before: dict[str, dict], roles) -> dict[str, dict[str, int]]:
        out = {}
        for role in roles:
            now = stats(role)
            out[role] = {k: v - before[role][k] for k, v in now.items() if v != before[role][k]}
        return out

    # dev0: altmark_rx, then the reflector; dev1: altmark_rx, then the collector
    run_tool(BUILD / R, "attach", "--netns", ns, "--dev", dev0, "--pin-dir", str(refl))
    run_tool(BUILD / R, "add-address", "--pin-dir", str(refl), REFLECTOR_ADDR)
    run_tool(BUILD / R, "add-session", "--pin-dir", str(refl), "--ssid", str(TEST_SSID))
    run_tool(BUILD / C, "attach", "--netns", ns, "--dev", dev1, "--pin-dir", str(coll))
    run_tool(BUILD / C, "activate", "--pin-dir", str(coll), "--ssid", str(REPLY_SSID), "--port", str(SENDER_PORT))
    run_tool(BUILD / A, "attach", "--netns", ns, "--dev", dev1, *amrx)
    run_tool(BUILD / A, "attach-dev", "--netns", ns, "--dev", dev0, *amrx)
    run_tool(BUILD / A, "add-flow", *amrx, "--sids", ",".join(POLICY), "--flow-id", "7", "--method", "dscp",
             "--period-ms", "1000")  # fmt: skip
    assert [e["role"] for e in chain_of(ns, inst)[dev0]] == [A, R]
    assert [e["role"] for e in chain_of(ns, inst)[dev1]] == [A, C]
    d = DispatcherRun(ns, inst)
    roles = (A, C, R)
    cases = [
        # (device, frame, verdict, {role: counter}); the reflector's verdict and reply come out
        (dev0, _stamp_test_frame(), XDP_TX, {A: "pass_no_srh", R: "reflected"}),
        (dev0, encapped(tclass=0x04), XDP_PASS, {A: "counted_dscp", R: "pass_not_local_addr"}),
        (dev0, _stamp_reply_frame(), XDP_PASS, {A: "pass_no_srh", R: "pass_not_local_addr"}),
        # a Hop-by-Hop header (in-line IOAM's trace) before the UDP: counted and passed on by each
        (dev0, _stamp_test_frame(hbh=True), XDP_PASS, {A: "pass_no_srh", R: "pass_other_ext_header"}),
        (dev1, _stamp_reply_frame(), XDP_DROP, {A: "pass_no_srh", C: "collected"}),
        (dev1, _stamp_test_frame(), XDP_PASS, {A: "pass_no_srh", C: "pass_not_stamp_reply"}),
        (dev1, _stamp_reply_frame(hbh=True), XDP_PASS, {A: "pass_no_srh", C: "pass_other_ext_header"}),
        # the destination is segments[0] with segments_left 1: at its final segment (the NEXT-C-SID
        # rule, datapath/stamp_parse.bpf.h), and what follows the SRH is the inner IPv6, not UDP
        (dev1, encapped(tclass=0x00), XDP_PASS, {A: "counted_dscp", C: "pass_not_udp"}),
    ]
    for dev, frame, verdict, counters in cases:
        before = {role: stats(role) for role in roles}
        got, out, _ = d.run(frame, ifindex[dev])
        assert got == verdict, (dev, counters)
        assert moved(before, roles) == {role: ({counters[role]: 1} if role in counters else {}) for role in roles}
        if verdict == XDP_TX:
            reply = parse_frame(out)
            assert (reply.src, reply.dst, reply.sport, reply.dport, reply.hlim) == (
                REFLECTOR_ADDR, "fd00:31::1", 862, 50021, 255)  # fmt: skip
            assert ReflectorPacket.decode(reply.udp[8:52]).sender_seq == 7
        elif verdict == XDP_PASS:
            assert out == frame  # passed on untouched
    rec = json.loads(run_tool(BUILD / C, "dump", "--pin-dir", str(coll), "--count", "1").stdout)
    assert (rec["ssid"], rec["sender_seq"], rec["ifindex"]) == (REPLY_SSID, 9, ifindex[dev1])
    # a device not in the chain (the test run's default, lo): nothing runs, the packet passes
    before = {role: stats(role) for role in roles}
    assert d.run(_stamp_test_frame(), 1)[0] == XDP_PASS
    assert moved(before, roles) == {role: {} for role in roles}
    # what the dispatcher adds (-s): the member alone (its own test run finds no device and
    # passes on to nobody) vs the dispatcher and the member, a monitored packet, looped in the kernel
    dscp = encapped(tclass=0x04)
    alone = min(PinnedTestRun(PIN_ROOT / inst / A / "prog").run(dscp, repeat=20_000)[2] for _ in range(3))
    chained = min(d.run(dscp, ifindex[dev0], repeat=20_000)[2] for _ in range(3))
    print(f"\naltmark_rx on a monitored packet: {alone} ns alone, {chained} ns through the dispatcher "
          f"(and the reflector, which passes it)")  # fmt: skip
    # a member that leaves stops there at once; the others on the device keep their verdicts
    run_tool(BUILD / A, "detach-dev", "--netns", ns, "--dev", dev0, *amrx)
    before = {role: stats(role) for role in roles}
    assert d.run(_stamp_test_frame(), ifindex[dev0])[0] == XDP_TX
    assert moved(before, roles) == {A: {}, C: {}, R: {"reflected": 1}}
    run_tool(BUILD / R, "detach", "--netns", ns, "--dev", dev0, "--pin-dir", str(refl))
    assert xdp_program(ns, dev0) is None and xdp_program(ns, dev1) == "xdp_chain"
    assert d.run(_stamp_test_frame(), ifindex[dev0])[0] == XDP_PASS
