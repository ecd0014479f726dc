"""Run one STAMP session through the whole segscope pipeline on this machine.

Stage by stage (one file per stage, in the order a STAMP packet travels):
  collectors/stamp_sender.c       A sends test packets over the SRv6 path, T1 just before send
  datapath/stamp_reflector.bpf.c  B's XDP reflector stamps T2/T3, returns on the return SID list
  datapath/stamp_collector.bpf.c  A's XDP collector stamps T4, one record per reply -> ring buffer
  collectors/stamp_streamer.c     ring buffer -> Kafka `segscope.stamp.records` (batched per session)
  processors/delay/app.py         Faust: delays per session and second -> line protocol `segscope.metrics`
  services/telegraf/telegraf.conf Telegraf: `segscope.metrics` -> InfluxDB database `segscope`
  dashboards/                     Grafana panels over InfluxDB

This module wires those stages together for the demo (scripts/demo.py) and the
end-to-end test (tests/e2e). Issue 6's controller will replace the ad-hoc
datapath calls here with the southbound API.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build"
PY = sys.executable


def _log(msg: str) -> None:
    print(f"[segscope] {msg}", file=sys.stderr, flush=True)


@dataclass
class StampSessionSpec:
    """One STAMP session between a sender node and a reflector node of a netlab topology."""
    ssid: int = 1
    sender_node: str = "A"
    sender_dev: str = "a0"           # where replies arrive: the XDP collector sits here
    sender_addr: str = "fc00:1::1"
    reflector_node: str = "B"
    reflector_dev: str = "b0"        # where test packets arrive: the XDP reflector sits here
    reflector_addr: str = "fc00:3::1"
    segs: list[str] = field(default_factory=lambda: ["fc00:2::e"])         # forward SID list
    return_segs: list[str] = field(default_factory=lambda: ["fc00:2::e"])  # return SID list
    rate_pps: int = 100

    @property
    def sender_port(self) -> int:
        return 50000 + self.ssid


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("check", True)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    try:
        return subprocess.run(cmd, **kw)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"command failed ({e.returncode}): {' '.join(cmd)}\n{e.stderr or ''}{e.stdout or ''}") from None


class LocalPipeline:
    """Datapath + streamer + processor for one session on a running Lab and Stack."""

    def __init__(self, lab, stack, spec: StampSessionSpec, run_dir: Path):
        self.lab, self.stack, self.spec = lab, stack, spec
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.instance = lab.prefix
        self.pin_root = Path("/sys/fs/bpf/segscope") / self.instance
        self.refl_pin = self.pin_root / "stamp_reflector"
        self.coll_pin = self.pin_root / "stamp_collector"
        self.procs: dict[str, subprocess.Popen] = {}
        self.attached: list[tuple[str, str, str, Path]] = []

    # -- datapath -------------------------------------------------------------------------
    def load_datapath(self) -> None:
        """Attach the reflector and the collector, then configure the pipeline's session."""
        s, lab = self.spec, self.lab
        refl, coll = self._tool("stamp_reflector"), self._tool("stamp_collector")
        run([refl, "attach", "--netns", lab.ns(s.reflector_node), "--dev", s.reflector_dev,
             "--pin-dir", str(self.refl_pin)])
        self.attached.append((refl, lab.ns(s.reflector_node), s.reflector_dev, self.refl_pin))
        run([refl, "add-address", "--pin-dir", str(self.refl_pin), s.reflector_addr])
        run([coll, "attach", "--netns", lab.ns(s.sender_node), "--dev", s.sender_dev,
             "--pin-dir", str(self.coll_pin)])
        self.attached.append((coll, lab.ns(s.sender_node), s.sender_dev, self.coll_pin))
        self.add_session(s)

    def add_session(self, s: StampSessionSpec) -> None:
        """Configure one more session between the same nodes (reflector session + active SSID)."""
        cmd = [self._tool("stamp_reflector"), "add-session", "--pin-dir", str(self.refl_pin),
               "--ssid", str(s.ssid), "--sender", s.sender_addr]
        if s.return_segs:
            cmd += ["--return-sids", ",".join(s.return_segs)]
        run(cmd)
        run([self._tool("stamp_collector"), "activate", "--pin-dir", str(self.coll_pin),
             "--ssid", str(s.ssid), "--port", str(s.sender_port)])

    @staticmethod
    def _tool(name: str) -> str:
        return str(BUILD / "datapath" / name)

    def datapath_stats(self) -> dict[str, dict[str, int]]:
        out = {}
        for name, pin in (("stamp_reflector", self.refl_pin), ("stamp_collector", self.coll_pin)):
            r = run([str(BUILD / "datapath" / name), "stats", "--pin-dir", str(pin), "--json"])
            out[name] = json.loads(r.stdout)
        return out

    # -- user-space stages ----------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.run_dir / f"{name}.log", "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                             env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs[name] = p
        return p

    def start_streamer(self) -> None:
        self.streamer_stats = self.run_dir / "streamer-stats.json"
        self._spawn("streamer", [
            str(BUILD / "collectors" / "stamp_streamer"),
            "--ringbuf", str(self.coll_pin / "stamp_records"),
            "--datapath-stats", str(self.coll_pin / "stamp_collector_stats"),
            "--brokers", self.stack.kafka_bootstrap, "--node", self.spec.sender_node,
            "--stats-json", str(self.streamer_stats)])

    def start_processor(self) -> None:
        self._spawn("processor", [PY, "-m", "processors.delay"],
                    env={"SEGSCOPE_KAFKA": self.stack.kafka_bootstrap})

    def run_sender(self, duration_s: float, progress=None, spec: StampSessionSpec | None = None) -> dict:
        """Send one session's test packets for duration_s seconds; returns the sender's JSON summary."""
        s = spec or self.spec
        cmd = [str(BUILD / "collectors" / "stamp_sender"), "--netns", self.lab.ns(s.sender_node),
               "--src", s.sender_addr, "--dst", s.reflector_addr, "--segs", ",".join(s.segs),
               "--ssid", str(s.ssid), "--sport", str(s.sender_port), "--rate", str(s.rate_pps),
               "--duration", str(duration_s)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs["sender"] = p
        t0 = time.monotonic()
        while p.poll() is None:
            if progress:
                progress(min(time.monotonic() - t0, duration_s), duration_s)
            time.sleep(0.5)
        out, err = p.communicate()
        del self.procs["sender"]
        if p.returncode != 0:
            raise RuntimeError(f"stamp_sender exited {p.returncode}: {err.strip()}")
        return json.loads(out.strip().splitlines()[-1])

    # -- teardown -------------------------------------------------------------------------
    def stop(self) -> dict[str, int]:
        """Stop user-space stages (SIGTERM: streamer drains and flushes), detach the datapath."""
        codes = {}
        for name in ("sender", "streamer", "processor"):
            p = self.procs.pop(name, None)
            if p is None:
                continue
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                codes[name] = p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                codes[name] = p.wait()
        for tool, ns, dev, pin in reversed(self.attached):
            subprocess.run([tool, "detach", "--netns", ns, "--dev", dev, "--pin-dir", str(pin)],
                           capture_output=True)
        self.attached.clear()
        return codes
