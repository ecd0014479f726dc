"""Alternate-marking test harness: traffic, nftables ground truth, block snapshots.

Independent of segscope's own datapath, so it can judge it:

- `Traffic`: tests/e2e/tools/flows_udp on H1, every flow of tests.groundtruth.altmark_flows at a fixed
  rate, plus the unmonitored flow; prints exactly how many packets entered H1's stack per flow.
- `GroundTruth`: nftables on R (prerouting, before End rewrites the destination) identifies a
  flow by its outer destination = the flow's first SID (distinct per flow) and the colour by the
  mark itself — method dscp: the L bit of the outer Traffic Class (DSCP bit 0 = TC 0x04,
  `@nh,9,1`); method rfc9343: the L flag of the AltMark option in the 8-byte Destination Options
  header right after the IPv6 header (`@nh,372,1`, FlowMonID `@nh,352,20`, offsets per
  datapath/altmark.h). Per (flow, colour) it counts the packets seen and drops packets at random
  (`numgen random mod 10000 < rate`) with a counter of exactly the dropped ones. On H2 (input) it
  counts what arrives per flow, and counts packets whose Traffic Class differs from what the
  sender set or that carry any extension header (marking leaked past the egress edge).
- `BlockSnapshots`: reads R's counters at TAI block_end + margin (the collector's moment), so
  each colour's cumulative counters turn into exact per-block seen/dropped numbers.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.groundtruth.altmark_flows import UNMONITORED_DST, UNMONITORED_SIDS, UNMONITORED_TCLASS, FlowSpec

REPO = Path(__file__).resolve().parents[2]
FLOWS_UDP = REPO / "build" / "tests" / "flows_udp"
GT_TABLE = "amgt"  # table inet on R
H2_TABLE = "amh2"  # table inet on H2
UNMON = "unmonitored"
# AltMark option (datapath/altmark.h): 8-byte DOH right after the 40-byte IPv6 header:
# next header, hdr ext len, option type 0x12, opt data len 4, FlowMonID(20) | L | D | reserved(10)
DOH_NH_BITS = 48  # IPv6 next header field, bit offset from the network header
DOH_OPT_TYPE_BITS = 40 * 8 + 16
DOH_FLOWMON_BITS = 40 * 8 + 32
DOH_L_BITS = DOH_FLOWMON_BITS + 20
DSCP_L_BITS = 4 + 5  # Traffic Class starts at bit 4; TC bit 0x04 (DSCP bit 0) is its 6th bit


def ensure_tools() -> None:
    subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "e2e" / "tools")], check=True)


def tai_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_TAI)


# ------------------------------------------------------------------------------- nftables
def _colour_match(flow: FlowSpec, colour: int) -> str:
    if flow.method == "dscp":
        return f"@nh,{DSCP_L_BITS},1 {colour}"
    return f"@nh,{DOH_L_BITS},1 {colour}"


def _threshold(loss_pct: float) -> int:
    return round(loss_pct * 100)  # numgen over 0..9999: 0.01 % resolution


def r_ruleset(flows: list[FlowSpec], flowmon_ids: dict[str, int]) -> str:
    """nft script for R: one chain per flow, dispatched by a verdict map on the outer destination."""
    chains = []
    for f in flows:
        rules = []
        if f.method == "rfc9343":
            # a packet of an rfc9343 flow without the option, or with another FlowMonID, is a
            # datapath bug: count it apart (and let it pass untouched, never dropped)
            rules.append(f'@nh,{DOH_NH_BITS},8 != 60 counter accept comment "{f.name} nodoh"')
            rules.append(f'@nh,{DOH_OPT_TYPE_BITS},8 != 0x12 counter accept comment "{f.name} badopt"')
            rules.append(f'@nh,{DOH_FLOWMON_BITS},20 != {flowmon_ids[f.name]} counter accept comment "{f.name} badfm"')
        for c in (0, 1):
            rules.append(f'{_colour_match(f, c)} counter comment "{f.name} seen {c}"')
        for c in (0, 1):
            rules.append(
                f'{_colour_match(f, c)} numgen random mod 10000 < {_threshold(f.loss_pct)} '
                f'counter drop comment "{f.name} drop {c}"'
            )
        chains.append(f"  chain {f.name} {{\n" + "".join(f"    {r}\n" for r in rules) + "  }\n")
    unmon = [
        f'counter comment "{UNMON} seen"',
        f'@nh,4,8 != {UNMONITORED_TCLASS} counter comment "{UNMON} tc_changed"',
        f'@nh,{DOH_NH_BITS},8 == 60 counter comment "{UNMON} doh"',
    ]
    chains.append(f"  chain {UNMON} {{\n" + "".join(f"    {r}\n" for r in unmon) + "  }\n")
    vmap = ", ".join(f"{f.first_sid} : jump {f.name}" for f in flows)
    vmap += f", {UNMONITORED_SIDS[0]} : jump {UNMON}"
    return (
        f"table inet {GT_TABLE} {{\n"
        + "".join(chains)
        + "  chain pre {\n    type filter hook prerouting priority -150; policy accept;\n"
        + f"    ip6 daddr vmap {{ {vmap} }}\n  }}\n}}\n"
    )


def h2_ruleset(flows: list[FlowSpec]) -> str:
    """nft script for H2: per destination, count arrivals, changed Traffic Class, non-UDP; drop
    (nothing listens: dropping avoids ICMP port-unreachable replies)."""
    dsts = [(f.name, f.dst, f.tclass) for f in flows] + [(UNMON, UNMONITORED_DST, UNMONITORED_TCLASS)]
    chains = []
    for name, _dst, tclass in dsts:
        rules = [
            f'counter comment "{name} rx"',
            f'@nh,4,8 != {tclass} counter comment "{name} tc_changed"',
            f'@nh,{DOH_NH_BITS},8 != 17 counter comment "{name} not_udp"',
            "udp dport 9 drop",
        ]
        chains.append(f"  chain h_{name} {{\n" + "".join(f"    {r}\n" for r in rules) + "  }\n")
    vmap = ", ".join(f"{dst} : jump h_{name}" for name, dst, _ in dsts)
    return (
        f"table inet {H2_TABLE} {{\n"
        + "".join(chains)
        + "  chain in {\n    type filter hook input priority 0; policy accept;\n"
        + f"    ip6 daddr vmap {{ {vmap} }}\n  }}\n}}\n"
    )


def counters_from_json(out: str) -> dict[str, int]:
    """{rule comment: packets} of every counted rule in `nft -j list table` output."""
    counters: dict[str, int] = {}
    for item in json.loads(out)["nftables"]:
        rule = item.get("rule")
        if not rule or "comment" not in rule:
            continue
        for expr in rule["expr"]:
            if "counter" in expr:
                counters[rule["comment"]] = int(expr["counter"]["packets"])
    return counters


def read_counters(lab, node: str, table: str) -> dict[str, int]:
    """{rule comment: packets} of every counted rule of our table on node."""
    return counters_from_json(lab.run(node, ["nft", "-j", "list", "table", "inet", table], check=True).stdout)


class NftInNamespace:
    """libnftables in the calling thread, moved into a network namespace: a table read costs
    well under a millisecond and no process. BlockSnapshots reads with it because a fork of
    `ip netns exec ... nft` per read was once starved past the whole read window on a loaded
    2-vCPU CI runner, which left a block without ground truth. setns moves only the calling
    thread, so make and use it in one thread (the snapshot thread), never in the test's own."""

    CLONE_NEWNET = 0x40000000
    OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON (nftables/libnftables.h)

    def __init__(self, netns: str):
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            if libc.setns(fd, self.CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns {netns}: {os.strerror(err)}")
        finally:
            os.close(fd)
        lib = self._lib = ctypes.CDLL("libnftables.so.1")
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        for fn in ("nft_ctx_buffer_output", "nft_ctx_buffer_error", "nft_ctx_free"):
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        for fn in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, fn).restype = ctypes.c_char_p
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        self._ctx = lib.nft_ctx_new(0)
        if not self._ctx:
            raise OSError(0, "nft_ctx_new failed")
        lib.nft_ctx_output_set_flags(self._ctx, self.OUTPUT_JSON)
        lib.nft_ctx_buffer_output(self._ctx)
        lib.nft_ctx_buffer_error(self._ctx)

    def counters(self, table: str) -> dict[str, int]:
        lib = self._lib
        if lib.nft_run_cmd_from_buffer(self._ctx, f"list table inet {table}".encode()) != 0:
            raise OSError(0, f"nft list table inet {table}: {lib.nft_ctx_get_error_buffer(self._ctx).decode().strip()}")
        return counters_from_json(lib.nft_ctx_get_output_buffer(self._ctx).decode())

    def close(self) -> None:
        if self._ctx:
            self._lib.nft_ctx_free(self._ctx)
            self._ctx = None


@dataclass
class GroundTruth:
    lab: object
    flows: list[FlowSpec]
    flowmon_ids: dict[str, int]

    def install(self) -> None:
        for node, script in (("R", r_ruleset(self.flows, self.flowmon_ids)), ("H2", h2_ruleset(self.flows))):
            self.lab.run(node, ["nft", "-f", "-"], input=script, check=True)

    def r_counters(self) -> dict[str, int]:
        return read_counters(self.lab, "R", GT_TABLE)

    def h2_counters(self) -> dict[str, int]:
        return read_counters(self.lab, "H2", H2_TABLE)


# ------------------------------------------------------------------------------- snapshots
def _realtime_thread() -> bool:
    """Ask SCHED_FIFO for the calling thread (pid 0 = this thread on Linux): the read must land
    in a window of T/2 while the rest of the test loads both CPUs. False where it is refused."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return True
    except (OSError, AttributeError):
        return False


@dataclass
class BlockSnapshots:
    """Reads R's counters at TAI (k + 1) * T + margin for every block k, in a thread.

    At that moment block k's colour (k & 1) has been inactive for `margin`, so the cumulative
    counters of that colour minus their value at the previous same-colour snapshot are exactly
    block k (what the collector does with the datapath's counters). A read that ends after
    (k + 2) * T, when the colour is active again, is not a snapshot of k: it goes to `missed`.
    The thread reads through libnftables inside R's namespace and asks for SCHED_FIFO, so a
    busy machine delays it by little."""

    truth: GroundTruth
    period_ns: int
    margin_ns: int
    snaps: dict[int, dict[str, int]] = field(default_factory=dict)  # block k -> counters
    read_lateness_ms: list[float] = field(default_factory=list)
    missed: dict[int, float] = field(default_factory=dict)  # block k -> ms from due to the read's end

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="altmark-snapshots", daemon=True)
        self.error: BaseException | None = None
        self.realtime = False  # whether the thread got SCHED_FIFO

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            self.realtime = _realtime_thread()
            nft = NftInNamespace(self.truth.lab.ns("R"))
            try:
                self._read_blocks(nft)
            finally:
                nft.close()
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _read_blocks(self, nft: NftInNamespace) -> None:
        k = (tai_ns() - self.margin_ns) // self.period_ns  # next block whose read time is ahead
        while not self._stop.is_set():
            due = (k + 1) * self.period_ns + self.margin_ns
            wait = (due - tai_ns()) / 1e9
            if wait > 0 and self._stop.wait(wait):
                return
            started = tai_ns()
            counters = nft.counters(GT_TABLE)
            done = tai_ns()
            self.read_lateness_ms.append((started - due) / 1e6)
            if done < (k + 2) * self.period_ns:
                self.snaps[k] = counters  # read while the colour was still inactive
            else:  # the colour is active again: no ground truth for k (the test says so)
                self.missed[k] = (done - due) / 1e6
            k += 1

    def per_block(self, flow: str) -> dict[int, dict[str, int]]:
        """{block k: {"seen": n, "dropped": n}} for every block with a same-colour snapshot before."""
        out = {}
        for k, snap in self.snaps.items():
            prev = self.snaps.get(k - 2)
            if prev is None:
                continue
            c = k & 1
            out[k] = {
                key: snap[f"{flow} {key2} {c}"] - prev[f"{flow} {key2} {c}"]
                for key, key2 in (("seen", "seen"), ("dropped", "drop"))
            }
        return out


# ------------------------------------------------------------------------------- traffic
@dataclass
class Traffic:
    lab: object
    flows: list[FlowSpec]
    rate_pps: float
    seconds: float
    proc: subprocess.Popen | None = None
    result: dict | None = None

    def command(self) -> list[str]:
        cmd = [str(FLOWS_UDP), "--rate", str(self.rate_pps), "--seconds", str(self.seconds)]
        for f in self.flows:
            cmd += ["--flow", f"{f.dst},{f.tclass}"]
        cmd += ["--flow", f"{UNMONITORED_DST},{UNMONITORED_TCLASS}"]
        return cmd

    def start(self) -> None:
        self.proc = self.lab.popen("H1", self.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait(self) -> dict:
        out, err = self.proc.communicate(timeout=self.seconds + 30)
        if self.proc.returncode != 0:
            raise RuntimeError(f"flows_udp exited {self.proc.returncode}: {err.strip()}")
        res = json.loads(out.strip().splitlines()[-1])
        names = [f.name for f in self.flows] + [UNMON]
        res["per_flow"] = dict(zip(names, res["sent_per_flow"]))
        self.result = res
        return res

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------------------------- other losses
# Where a packet of H1 -> H2 can be lost besides our nft rule: a veth whose peer's backlog (or
# XDP ring) is full drops it and counts it as tx_dropped of the sending device; the delay relay
# counts its own drops. (node, device) in path order; "dly-ar" is the relay namespace.
PATH_DEVICES = (("H1", "h1"), ("A", "a0"), ("dly-ar", "rb"), ("R", "r1"), ("B", "bh"))


def _tx_dropped(lab, ns: str, dev: str) -> int:
    out = subprocess.run(
        ["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev], capture_output=True, text=True, check=True
    ).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["dropped"])


def path_drops(lab) -> dict[str, int]:
    """Cumulative drops outside our nft rule on the H1 -> H2 path, per place."""
    out = {}
    for node, dev in PATH_DEVICES:
        ns = f"{lab.prefix}-{node}"
        if node.startswith("dly-") and node[4:] not in lab.relays:
            continue
        out[f"{node}:{dev}"] = _tx_dropped(lab, ns, dev)
    for link in lab.relays:
        st = lab.relay_stats(link)["a_to_b"]
        out[f"relay:{link}"] = st["dropped_queue_full"] + st["dropped_oversize"] + st["dropped_socket"]
        out[f"relay:{link}:send_errors"] = st["send_errors"]
    return out


def drops_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Drops per place between two path_drops() readings, each lost packet counted once: a frame
    the relay fails to send is one the veth it sends on (rb) dropped and counted, so relay send
    errors count only beyond rb's tx_dropped."""
    delta = {k: after[k] - before.get(k, 0) for k in after}
    for key in [k for k in delta if k.endswith(":send_errors")]:
        rb = delta.get(f"dly-{key.split(':')[1]}:rb", 0)
        delta[key] = max(0, delta[key] - rb)
    return delta


# ------------------------------------------------------------------------------- segscope parts
BUILD = REPO / "build"
PIN_ROOT = Path("/sys/fs/bpf/segscope")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}{proc.stdout}")
    return proc


@dataclass
class AltmarkEdges:
    """segscope's datapath on the lab: altmark_tx on A's a0 (TC egress), altmark_rx on B's b0
    (XDP), flows installed with the loaders (datapath/altmark_loader.c CLI)."""

    lab: object
    period_ms: int
    dmark_every: int
    flow_ids: dict[str, int]  # flow name -> flow id (FlowMonID for rfc9343)
    attached: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def tx_instance(self) -> str:
        return f"{self.lab.prefix}-A"  # netlab's teardown removes /sys/fs/bpf/segscope/<prefix>-*

    @property
    def rx_instance(self) -> str:
        return f"{self.lab.prefix}-B"

    def pin_dir(self, prog: str) -> Path:
        return PIN_ROOT / (self.tx_instance if prog == "altmark_tx" else self.rx_instance) / prog

    def attach(self) -> None:
        for prog, node, dev, inst in (
            ("altmark_tx", "A", "a0", self.tx_instance),
            ("altmark_rx", "B", "b0", self.rx_instance),
        ):
            _run(
                [
                    str(BUILD / "datapath" / prog),
                    "attach",
                    "--dev",
                    dev,
                    "--instance",
                    inst,
                    "--netns",
                    self.lab.ns(node),
                ]
            )
            self.attached.append((prog, node, dev, inst))

    def add_flow(self, flow: FlowSpec, rx: bool | None = None) -> None:
        common = [
            "--flow-id",
            str(self.flow_ids[flow.name]),
            "--method",
            flow.method,
            "--period-ms",
            str(self.period_ms),
            "--dmark-every",
            str(self.dmark_every),
        ]
        _run(
            [
                str(BUILD / "datapath" / "altmark_tx"),
                "add-flow",
                "--instance",
                self.tx_instance,
                "--sids",
                ",".join(flow.sids),
            ]
            + common
        )
        if flow.has_rx if rx is None else rx:
            key = (
                ["--sids", ",".join(flow.sids)]
                if flow.method == "dscp"
                else ["--flowmon-id", str(self.flow_ids[flow.name])]
            )
            _run([str(BUILD / "datapath" / "altmark_rx"), "add-flow", "--instance", self.rx_instance] + key + common)

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            prog: json.loads(_run([str(BUILD / "datapath" / prog), "stats", "--instance", inst, "--json"]).stdout)
            for prog, _n, _d, inst in self.attached
        }

    def list_flows(self, prog: str) -> dict:
        inst = self.tx_instance if prog == "altmark_tx" else self.rx_instance
        return json.loads(_run([str(BUILD / "datapath" / prog), "list-flows", "--instance", inst, "--json"]).stdout)

    def detach(self) -> None:
        for prog, node, dev, inst in reversed(self.attached):
            subprocess.run(
                [
                    str(BUILD / "datapath" / prog),
                    "detach",
                    "--dev",
                    dev,
                    "--instance",
                    inst,
                    "--netns",
                    self.lab.ns(node),
                ],
                capture_output=True,
            )
        self.attached.clear()


class Processes:
    """User-space stages started for a test: one block collector per edge node, the loss processor.
    Logs go to run_dir/<name>.log; stop() sends SIGTERM (collectors flush) and waits."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        import os

        log = open(self.run_dir / f"{name}.log", "w")
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def collector(
        self, name: str, node: str, direction: str, pin_dir: Path, brokers: str, topic: str = "segscope.altmark.blocks"
    ) -> None:
        self.spawn(
            name,
            [
                str(BUILD / "collectors" / "altmark_collector"),
                "--node",
                node,
                f"--{direction}-pin-dir",
                str(pin_dir),
                "--brokers",
                brokers,
                "--topic",
                topic,
            ],
        )

    def crash(self, name: str) -> int:
        """SIGKILL one of our processes (an agent crash: no flush, no goodbye); its exit code."""
        import os
        import signal

        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=10)

    def alive(self) -> dict[str, int | None]:
        return {n: p.poll() for n, p in self.procs.items()}

    def log(self, name: str) -> str:
        path = self.run_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> dict[str, int]:
        import os
        import signal

        codes = {}
        for proc in list(self.procs.values()):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for name, proc in list(self.procs.items()):
            try:
                codes[name] = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[name] = proc.wait()
        self.procs.clear()
        return codes


class BlockRecordTap:
    """Reads the collectors' block records back from Kafka (own consumer group, from a start
    time on), keeping our flows' records: {(flow_id, "tx"|"rx", block_index): record dict}.
    Lets a test tell a datapath/collector fault from a processor fault."""

    def __init__(self, bootstrap: str, flow_ids: set[int], since_ns: int, topic: str = "segscope.altmark.blocks"):
        self.bootstrap, self.flow_ids, self.since_ns, self.topic = bootstrap, flow_ids, since_ns, topic
        self.records: dict[tuple[int, str, int], dict] = {}
        self.duplicates = 0
        self.batches = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="altmark-tap", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            from confluent_kafka import Consumer, TopicPartition

            from segscope_schemas.altmark_block import decode_batch

            consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"altmark-tap-{id(self)}",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                }
            )
            meta = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            wanted = [TopicPartition(self.topic, p, self.since_ns // 1_000_000) for p in meta.partitions]
            consumer.assign(consumer.offsets_for_times(wanted, timeout=10))
            try:
                while not self._stop.is_set():
                    msg = consumer.poll(0.2)
                    if msg is None or msg.error():
                        continue
                    self._take(decode_batch(msg.value()))
            finally:
                consumer.close()
        except BaseException as exc:
            self.error = exc

    def _take(self, decoded) -> None:
        header, recs = decoded
        self.batches += 1
        for r in recs:
            if int(r["flow_id"]) not in self.flow_ids:
                continue
            key = (int(r["flow_id"]), "tx" if int(r["direction"]) == 1 else "rx", int(r["block_index"]))
            rec = {name: int(r[name]) for name in r.dtype.names}
            rec["node"] = header.node
            if key in self.records:
                self.duplicates += 1
            self.records[key] = rec


def create_topic(bootstrap: str, topic: str, partitions: int = 2) -> None:
    """A block topic of the test's own (same partition count as segscope.altmark.blocks)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=20)


def delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep it alive until the result
    admin.delete_topics([topic])[topic].result(timeout=20)
