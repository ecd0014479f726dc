"""What the in-line end-to-end tests (test_inline_mesh8.py, test_inline_ring6.py) share: the
pipeline through the product path (agents on every node, the controller applying an intent with
`inline_monitors`, the in-line and delay processors on the stack's Kafka, Telegraf, InfluxDB),
sequence-numbered traffic in the background (netlab.seqflow: the receiver's RFC 4737 counts are
ground truth too) and the readers of what InfluxDB holds.

Not a test module: no fixtures here, each test module builds its own lab (one per topology).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from controller.intent import parse_intent
from controller.pipeline import ControlledPipeline
from netlab import relay_flow
from segscope_proto.segscope.agent.v1 import inline_pb2

REPO = Path(__file__).resolve().parents[2]
NS = 1_000_000_000
INGRESS, EGRESS = inline_pb2.INLINE_SIDE_INGRESS, inline_pb2.INLINE_SIDE_EGRESS
ENV = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'schemas' / 'python'}"}
# run as a script: the standard library only, not the netlab package (a sender starts in ~50 ms
# instead of ~250 ms, which is seconds on a loaded VM)
SEQFLOW = str(REPO / "netlab" / "seqflow.py")


class InlinePipeline(ControlledPipeline):
    """Agents (ControlledPipeline.start_agents) + the in-line and the delay processor, each in a
    consumer group of its own (a shared stack carries other runs' groups)."""

    def start_processors(self) -> None:
        run = uuid.uuid4().hex[:8]
        for kind in ("inline", "delay"):
            log = open(self.run_dir / f"{kind}-processor.log", "w")
            app_id = f"e2e-{kind}-{run}"
            self.processors[kind] = subprocess.Popen(
                [sys.executable, "-m", f"processors.{kind}", "--bootstrap", self.stack.kafka_bootstrap,
                 "--app-id", app_id, "--datadir", str(self.run_dir / app_id), "-l", "info"],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                env={**ENV, f"SEGSCOPE_{kind.upper()}_HEALTH": "127.0.0.1:0"},
            )  # fmt: skip
            log.close()

    def wait_processors(self, timeout_s: float = 120) -> None:
        """Until each worker owns its input partitions (it then reads every record produced)."""
        deadline = time.monotonic() + timeout_s
        for kind in self.processors:
            log = self.run_dir / f"{kind}-processor.log"
            while "rebalance: own" not in log.read_text(errors="replace"):
                if self.processors[kind].poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{kind} processor not ready:\n{log.read_text(errors='replace')[-3000:]}")
                time.sleep(0.2)

    def apply_text(self, text: str, name: str) -> object:
        """Apply an intent given as YAML text (written to <run dir>/<name> for `controller status`)."""
        path = self.run_dir / name
        path.write_text(text)
        return self.apply(parse_intent(text, str(path)))

    def inline_counters(self, node: str, side: int, flow_id: int):
        """GetInlineMonitorResults of one side: the ingress's or the egress's counters."""
        client = self.ctl.client(node)
        res = client.call(
            client.inline,
            "GetInlineMonitorResults",
            inline_pb2.GetInlineMonitorResultsRequest(side=side, flow_id=flow_id),
        )
        return res.ingress if side == INGRESS else res.egress

    def status(self, intent_name: str, influx_url: str, json_out: bool = True, window_s: int = 120):
        """`python -m controller status [--json]` on the intent last applied, as an operator runs it:
        the parsed JSON, or the text."""
        proc = subprocess.run(
            [sys.executable, "-m", "controller", "status", *(["--json"] if json_out else []),
             str(self.run_dir / intent_name), "--influx-url", influx_url, "--window", str(window_s)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": ENV["PYTHONPATH"]},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout) if json_out else proc.stdout

    def status_json(self, intent_name: str, influx_url: str) -> dict:
        return self.status(intent_name, influx_url)


@dataclass
class Flow:
    """One monitored flow's traffic: seqflow from `src` to `dst_addr` (in `dst`), one packet every
    interval_us, IPv6 flow label `label` (the relays' flow key, carried to the outer header by the
    seg6 encapsulation)."""

    name: str
    src: str
    dst: str
    dst_addr: str
    port: int
    label: int
    count: int
    interval_us: int
    size: int = 200
    src_addr: str | None = None
    procs: dict = field(default_factory=dict)
    result: dict = field(default_factory=dict)
    late_s: float = 0.0

    def receive(self, lab, wait_s: float = 30) -> None:
        """Start the receiver (RFC 4737 counts from the sender's sequence numbers)."""
        timeout = wait_s + self.count * self.interval_us / 1e6 + 15
        recv = [sys.executable, SEQFLOW, "recv", "--port", str(self.port), "--expect",
                str(self.count), "--timeout", str(timeout), "--idle", "3"]  # fmt: skip
        self.procs["recv"] = lab.popen(self.dst, recv, stdout=subprocess.PIPE, text=True, env=ENV)
        if self.procs["recv"].stdout.readline().strip() != "ready":
            raise AssertionError(f"{self.name}: the seqflow receiver did not start")

    def send(self, lab, start_at: float) -> None:
        """Start the sender; its first packet leaves at wall clock start_at (every flow in step)."""
        send = [sys.executable, SEQFLOW, "send", "--dst", self.dst_addr, "--port", str(self.port),
                "--count", str(self.count), "--interval-us", str(self.interval_us), "--size", str(self.size),
                "--flow-label", str(self.label), "--start-at", f"{start_at:.6f}"]  # fmt: skip
        if self.src_addr:
            send += ["--src", self.src_addr]
        self.procs["send"] = lab.popen(self.src, send, stdout=subprocess.PIPE, text=True, env=ENV)

    def started(self) -> float:
        """Block until the sender's first packet left; how late after start_at it was (s)."""
        line = self.procs["send"].stdout.readline()
        if not line:
            raise AssertionError(f"{self.name}: the seqflow sender exited before sending")
        self.late_s = json.loads(line)["started_late_s"]
        return self.late_s

    def wait(self, timeout_s: float = 120) -> dict:
        out, _ = self.procs["send"].communicate(timeout=timeout_s)
        sent = json.loads(out.strip().splitlines()[-1])
        got = json.loads(self.procs["recv"].communicate(timeout=timeout_s)[0])
        flow = got["flows"].get("0", {"received": 0, "distinct": 0, "duplicates": 0, "reordered": 0})
        self.result = {"sent": sent["sent"]["0"], "errors": sent["errors"]["0"], "late_s": self.late_s,
                       **flow, "socket_drops": got["socket_drops"], "bad": got["bad"]}  # fmt: skip
        return self.result

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def start_in_step(lab, flows: list[Flow], lead_s: float = 3.0) -> tuple[float, float]:
    """Every receiver, then every sender with the same first-packet time (a sender's Python start
    takes a second or more under load); returns once every first packet has left: (the common
    start time, the latest real start), wall clock."""
    for f in flows:
        f.receive(lab)
    start_at = time.time() + lead_s
    for f in flows:
        f.send(lab, start_at)
    return start_at, start_at + max(f.started() for f in flows)


def run_flow_ids(base: int, n: int) -> list[int]:
    """n flow ids of this run: an in-line processor reading the records topic from its start
    would otherwise see an earlier run's records of the same flow (another monitor, sequence
    numbers from 0 again) before these."""
    return [base + (time.time_ns() // NS % 100_000) * 10 + i for i in range(1, n + 1)]


def hop_ground_truth(window: dict, flow: Flow, hops: list[tuple[str, str, str]]) -> list[dict]:
    """Per link of a flow's path [(link, direction, outer destination on it)], the relay's counters of
    exactly this flow's frames over the window (relay_ground_truth): relay_mean_us = injected delay
    (with any hold) + the relay's lateness, per frame; drops; reordered."""
    return [
        {"link": link, "direction": d, **relay_flow(window[link], d, dst=outer, flow_label=flow.label)}
        for link, d, outer in hops
    ]


def points(stack, measurement: str, flow_id: int, since_ns: int, settled: bool = True) -> list[dict]:
    """The flow's points of the seconds from the one holding since_ns (a point is stamped with the
    start of its second)."""
    q = f"SELECT * FROM \"{measurement}\" WHERE \"flow\" = '{flow_id}' AND time >= {since_ns - since_ns % NS}"
    return stack.influx_query_settled(q, settle_s=0.5) if settled else stack.influx_query(q)


def stamp_points(stack, node: str, ssid: int, since_ns: int) -> list[dict]:
    q = f"SELECT * FROM \"stamp_delay\" WHERE \"node\" = '{node}' AND \"ssid\" = '{ssid}' AND time >= {since_ns}"
    return stack.influx_query_settled(q, settle_s=0.5)


def wait_for_records(stack, flow_ids: dict[int, int], since_ns: int, timeout_s: float = 60) -> None:
    """Until the inline_delay points of each flow account for the records its egress wrote."""
    deadline = time.monotonic() + timeout_s
    got: dict[int, int] = {}
    while time.monotonic() < deadline:
        got = {
            f: sum(int(p["count"]) for p in points(stack, "inline_delay", f, since_ns, False) if p.get("count"))
            for f in flow_ids
        }
        if all(got[f] >= n for f, n in flow_ids.items()):
            return
        time.sleep(1)
    raise AssertionError(f"inline_delay records in InfluxDB {got}, the egresses recorded {flow_ids}")


def weighted(rows: list[dict]) -> tuple[float, int]:
    """(mean over every packet, packets) of per-second points: sum of sum_us / sum of count."""
    n = sum(int(r["count"]) for r in rows)
    return (sum(r["sum_us"] for r in rows) / n if n else float("nan")), n


# In-line delay against STAMP over the same seconds. The two instruments stamp at different
# places: STAMP's T1 is read in user space just before sendto(), the in-line ingress stamp is taken
# at TC egress after the seg6 encap. So a STAMP forward delay also holds the sender's way through
# the kernel, which on a loaded 2-core runner averages tens of microseconds (the thread can be
# preempted between the clock read and the send): in-line forward may be below STAMP by that much,
# never above. The reverse direction starts at the reflector's XDP on both sides: symmetric bound.
STAMP_AGREEMENT_US = 50
SENDER_STACK_ALLOWANCE_US = 150


def agrees_with_stamp(direction: str, inline_minus_stamp_us: float) -> bool:
    low = -(STAMP_AGREEMENT_US + (SENDER_STACK_ALLOWANCE_US if direction == "forward" else 0))
    return low <= inline_minus_stamp_us <= STAMP_AGREEMENT_US


def median_difference(inline_rows: list[dict], stamp_rows: list[dict]) -> float:
    """Median over the seconds of (in-line p50 - STAMP p50), µs: robust to the few packets a
    stalled relay holds for milliseconds, which the per-second means of one side only carry."""
    diffs = sorted(float(i["p50_us"]) - float(s["p50_us"]) for i, s in zip(inline_rows, stamp_rows, strict=True))
    mid = len(diffs) // 2
    return diffs[mid] if len(diffs) % 2 else (diffs[mid - 1] + diffs[mid]) / 2
