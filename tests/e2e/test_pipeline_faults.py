"""The demo pipeline (controller, agents, delay processor, Kafka, Telegraf, InfluxDB) under a crash
of the sender's agent, with exact accounting.

One STAMP session A -> B through R (controller/examples/demo_line5.yaml's objects on
netlab/topologies/line5_bare.yaml). Mid-run the sender node's agent is SIGKILLed:

1. its stamp_sender and ring-buffer streamer die with it (PDEATHSIG), the streamer draining the
   ring to Kafka first; its XDP collector stays attached, pinned;
2. while no agent runs on A, a stamp_sender started by hand sends 100 more test packets over the
   same path: B reflects them and A's orphaned collector puts their replies into a ring nobody reads;
3. the agent is started again and `controller apply` (the same intent) finds the session absent and
   re-creates it: Init first drains the old ring to Kafka, then replaces the collector; the session
   runs again to its end.

Asserted: every reply B reflected is a record counted in InfluxDB (sum of `count` of the forward,
reverse and round-trip points = what B's reflector counted, minus counted collector drops, which are
0); the records of the orphaned ring are reported by the new agent; no second holds more records
than the session sends per second (nothing counted twice); no process of the agent is left over.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
from pathlib import Path

import pytest

from controller.intent import load_intent
from controller.pipeline import ControlledPipeline
from netlab import Lab, teardown
from scripts.results import StampSessionSpec, delay_points, records_in_influx
from tests.isolation import own_name

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "netlab" / "topologies" / "line5_bare.yaml"
INTENT = REPO / "controller" / "examples" / "demo_line5.yaml"
SSID, RATE, DURATION_S, KILL_AFTER_S, BY_HAND = 62, 100, 8, 4.0, 100

pytestmark = [pytest.mark.e2e, pytest.mark.datapath]


def intent():
    it = load_intent(INTENT)
    it.stamp_sessions = [dataclasses.replace(it.stamp_sessions[0], ssid=SSID, rate_pps=RATE, duration_s=DURATION_S)]
    return it


def agent_children(instance: str) -> list[str]:
    """Processes working for an agent instance (its sender, its streamer), by command line."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    mine = (f"/{instance}/", f"--netns {instance} ")
    return [
        line
        for line in out.splitlines()
        if ("stamp_sender" in line or "stamp_streamer" in line) and any(m in line for m in mine)
    ]


def test_sender_agent_killed_mid_run_loses_and_doubles_nothing(stack, bpffs, tmp_path):
    teardown(own_name("tflt"))
    lab = Lab.up(TOPOLOGY, prefix=own_name("tflt"))
    spec = StampSessionSpec(ssid=SSID, rate_pps=RATE)
    # the agents of before hitless restarts (their children die with them): tests/agent/test_agent_adoption.py
    # has the same crash with the default, where nothing stops
    pipe = ControlledPipeline(lab, stack, tmp_path, agent_args=["--adopt-timeout", "0"])
    try:
        pipe.start()
        since = time.time_ns()
        pipe.apply(intent())
        time.sleep(KILL_AFTER_S)

        # 1. the crash
        pipe.agents.kill("A")
        deadline = time.monotonic() + 10
        while agent_children(lab.ns("A")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert agent_children(lab.ns("A")) == [], "the killed agent's children outlived it"

        # 2. replies into the orphaned collector's ring
        demo = intent().stamp_sessions[0]
        by_hand = subprocess.run(
            [
                str(REPO / "build" / "collectors" / "stamp_sender"),
                "--netns",
                lab.ns("A"),
                "--src",
                demo.sender.address,
                "--dst",
                demo.reflector.address,
                "--ssid",
                str(SSID),
                "--sport",
                str(50000 + SSID),
                "--rate",
                str(BY_HAND),
                "--duration",
                "1",
                "--format",
                "ptp",
                "--segs",
                ",".join(demo.segs),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert by_hand.returncode == 0, by_hand.stderr
        time.sleep(0.5)  # the last replies land

        # 3. a new agent; apply re-creates the session, Init drains the old ring first
        pipe.agents.respawn("A")
        result = pipe.apply(intent())
        assert result.mutating_calls["A"]["CreateStampSession"] == 1, result.mutating_calls
        log = pipe.agents.logs["A"].read_text(errors="replace")
        left = re.search(
            r"(\d+) records a previous agent left in the collector's ring: (\d+) to Kafka, (\d+) lost", log
        )
        print(f"\n[faults] left in the orphaned ring: {left and left.group(0)}")
        assert left, log[-3000:]
        assert int(left.group(1)) == int(left.group(2)) >= BY_HAND and left.group(3) == "0", left.group(0)
        pipe.wait_stopped("A", SSID, timeout_s=DURATION_S + 30)

        stats = pipe.datapath_stats("A", "B")
        refl, coll = stats["stamp_reflector"], stats["stamp_collector"]
        assert sum(v for k, v in coll.items() if k.startswith("drop_")) == 0, coll
        assert sum(v for k, v in refl.items() if k.startswith("drop_")) == 0, refl
        expect = refl["reflected"]  # B's reflector ran through it all: every reply of all three senders
        assert expect >= KILL_AFTER_S * RATE * 0.8 + BY_HAND + DURATION_S * RATE

        got = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            got = {d: records_in_influx(stack, spec, since, d) for d in ("forward", "reverse", "round_trip")}
            if min(got.values()) >= expect:
                break
            time.sleep(1)
        print(f"[faults] reflected by B {expect}, records in InfluxDB {got}, collector {coll}")
        assert got == dict.fromkeys(got, expect), (got, expect, refl)
        # a second counted twice would be a second point of that second (another series: the
        # processor writes one point per second and direction, a re-emission replaces it): every
        # second has exactly one, and their counts add up to the replies. (Not a per-second rate
        # bound: the sender keeps an absolute schedule, so after a stall on a busy machine it catches
        # up and a second legitimately holds more than RATE.)
        per_second: dict[int, list[int]] = {}
        for p in delay_points(stack, spec, since):
            if p["direction"] == "forward":
                per_second.setdefault(p["time"], []).append(int(p["count"]))
        assert all(len(counts) == 1 for counts in per_second.values()), per_second
        assert sum(c for counts in per_second.values() for c in counts) == expect, per_second
    finally:
        codes = pipe.stop()
        lab.down()
    assert agent_children(lab.ns("A")) == []
    assert codes.get("delay-processor") == 0, codes
