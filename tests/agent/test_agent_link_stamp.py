"""Per-link STAMP on every core link of netlab mesh8_two_paths (the multi-path topology of
tests/e2e/test_multipath.py): one session per link, the way routers' SR-PM measures a link.

The sender on one end of a link sends from its address on that link to the neighbour's address
on the same link (a connected one-hop route: the probe cannot take another link). The XDP
reflector on the neighbour's interface answers with XDP_TX, back out of the interface the probe
came in on, so the reply crosses the same link the other way. Every node of the ring A-R1-R2-B-
R4-R3-A sends on one link and reflects on the other, so all six links are measured at once.

Each link has a delay relay with its own delay per direction. From a base phase (100 us per link
and direction) to the topology's delays, each session's one-way delays must change by the change
of its link's injected delay, after the relay's own lateness, within 100 us, per direction.

The agents run with --kafka: their records go through the real Kafka of the session stack to the
delay processor, and their node views to the topology processor, which writes the graph edges to
the ArangoDB stand-in (tests/topology/arango_standin.py, ArangoDB's REST contract); the edges
must carry each link's delay per direction the same way (test_link_probe_delays_on_the_edges).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from controller.core import Controller
from controller.intent import load_intent
from netlab import Lab, relay_ground_truth, teardown
from processors.topology.model import Identity
from processors.topology.writer import ArangoWriter
from segscope_proto.segscope.agent.v1 import stamp_pb2 as pb
from segscope_proto.segscope.agent.v1 import stamp_pb2_grpc
from tests.agent.agent_env import start_agent
from tests.isolation import own_name
from tests.topology.arango_standin import ArangoStandin

S, RF = pb.STAMP_ROLE_SENDER, pb.STAMP_ROLE_REFLECTOR
REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "netlab" / "topologies" / "mesh8_two_paths.yaml"
INTENT = REPO / "controller" / "examples" / "mesh8_link_probes.yaml"
PREFIX = own_name("lnk")
NODES = ("A", "R1", "R2", "R3", "R4", "B")
RATE, RUN_S, TOLERANCE_US, BASE_US = 100, 1.5, 100, 100.0
# ssid: (link, the link's direction the probes take, sender (node, dev, address), reflector (...))
# around the ring A -> R1 -> R2 -> B -> R4 -> R3 -> A: each node sends once and reflects once
LINK_SESSIONS = {
    61: ("a1", "a_to_b", ("A", "a1", "fc00:a1::1"), ("R1", "r1b", "fc00:a1::2")),
    62: ("c1", "a_to_b", ("R1", "r1c", "fc00:c1::1"), ("R2", "r2a", "fc00:c1::2")),
    63: ("b1", "a_to_b", ("R2", "r2c", "fc00:b1::1"), ("B", "b1", "fc00:b1::2")),
    64: ("b2", "b_to_a", ("B", "b2", "fc00:b2::2"), ("R4", "r4c", "fc00:b2::1")),
    65: ("c2", "b_to_a", ("R4", "r4a", "fc00:c2::2"), ("R3", "r3c", "fc00:c2::1")),
    66: ("a2", "b_to_a", ("R3", "r3a", "fc00:a2::2"), ("A", "a2", "fc00:a2::1")),
}  # fmt: skip
OTHER = {"a_to_b": "b_to_a", "b_to_a": "a_to_b"}

pytestmark = [pytest.mark.datapath]


@pytest.fixture(scope="module")
def mesh(bpffs):
    teardown(PREFIX)
    lab = Lab.up(TOPOLOGY, prefix=PREFIX)
    try:
        for link, *_ in LINK_SESSIONS.values():
            lab.set_loss(link, 0, 0)  # every probe and reply must come back: the counts are exact
        yield lab
    finally:
        lab.down()


@pytest.fixture(scope="module")
def agents(mesh, pki, stack, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("link-agents")
    # the example intent reaches the agents through SEGSCOPE_AGENT_<node> and names the
    # controller's client files controller.pem/.key under SEGSCOPE_CERTS
    (pki.dir / "controller.pem").write_bytes(pki.client_pem.read_bytes())
    (pki.dir / "controller.key").write_bytes(pki.client_key.read_bytes())
    started = {}
    old = dict(os.environ)
    try:
        for n in NODES:
            started[n] = start_agent(
                mesh.ns(n), n, run_dir, pki=pki, instance=f"{PREFIX}-{n}", kafka=stack.kafka_bootstrap
            )
            os.environ[f"SEGSCOPE_AGENT_{n}"] = started[n].address
        os.environ["SEGSCOPE_CERTS"] = str(pki.dir)
        mesh.agents = started
        yield started
    finally:
        os.environ.clear()
        os.environ.update(old)
        assert all(a.stop() == 0 for a in started.values())


def init_ends(stubs: dict, mode: int) -> None:
    """Each node: its sender on one link, its reflector on the other."""
    senders = {s[0]: s for _, _, s, _ in LINK_SESSIONS.values()}
    reflectors = {r[0]: r for _, _, _, r in LINK_SESSIONS.values()}
    for node, stub in stubs.items():
        _, sdev, saddr = senders[node]
        _, rdev, raddr = reflectors[node]
        init = stub.Init(
            pb.InitRequest(
                sender=pb.StampSenderConfig(device=sdev, source_address=saddr),
                reflector=pb.StampReflectorConfig(device=rdev, addresses=[raddr], mode=mode),
            )
        )
        assert init.reflector_running == mode, (node, init)


def start_sessions(stubs: dict, ssid_offset: int) -> None:
    for ssid, (_, _, (_, _, saddr), (rnode, _, _)) in LINK_SESSIONS.items():
        reflector = pb.StampSession(role=RF, ssid=ssid + ssid_offset, sender_address=saddr)
        stubs[rnode].CreateStampSession(pb.CreateStampSessionRequest(session=reflector))
        stubs[rnode].StartStampSession(pb.StartStampSessionRequest(role=RF, ssid=ssid + ssid_offset))
    for ssid, (_, _, (snode, _, _), (_, _, raddr)) in LINK_SESSIONS.items():
        sender = pb.StampSession(role=S, ssid=ssid + ssid_offset, reflector_address=raddr, rate_pps=RATE)
        stubs[snode].CreateStampSession(pb.CreateStampSessionRequest(session=sender))
        stubs[snode].StartStampSession(pb.StartStampSessionRequest(role=S, ssid=ssid + ssid_offset, duration_s=RUN_S))


def any_sender_running(stubs: dict) -> bool:
    for stub in stubs.values():
        for x in stub.ListStampSessions(pb.ListStampSessionsRequest()).sessions:
            if x.session.role == S and x.state == pb.STAMP_SESSION_STATE_RUNNING:
                return True
    return False


def results_request(ssid: int) -> pb.GetStampSessionResultsRequest:
    return pb.GetStampSessionResultsRequest(ssid=ssid, max_results=100000)


def by_agent_api(mode: int):
    def start(stubs: dict, ssid_offset: int) -> None:
        init_ends(stubs, mode)
        start_sessions(stubs, ssid_offset)

    return start


def by_controller(stubs: dict, ssid_offset: int) -> None:
    """The example intent's link probes, as finite runs, applied by the controller."""
    intent = load_intent(INTENT)
    intent.stamp_sessions = [
        dataclasses.replace(s, ssid=s.ssid + ssid_offset, duration_s=RUN_S, rate_pps=RATE)
        for s in intent.stamp_sessions
    ]
    with Controller(intent) as ctl:
        result = ctl.apply()
    assert result.ok, result.to_json()


def measured_phase(lab, agents, start, ssid_offset: int, edges=None) -> dict[int, dict[str, float]]:
    """One run of the six link sessions at the relays' current delays, started by `start`: per
    session, the median one-way delays and the delay each direction's relay injected plus the
    median of its lateness over the same frames (us). Medians on both sides: a frame the relay
    released late (a loaded machine) counts on both, and a probe held up outside the relay (a
    sender preempted between T1 and its send, a reflector's softirq deferred to ksoftirqd, at
    95 % CPU) moves neither, where it moved a mean by 100 us of a delay nobody injected. With
    `edges` (a Pipeline),
    also the delay the topology processor wrote on the link's edge per direction ("edge_fwd",
    "edge_rev"), read before the sessions are reset (a reset session leaves the views)."""
    links = [link for link, *_ in LINK_SESSIONS.values()]
    before = {link: lab.relay_stats(link) for link in links}
    channels = {n: agents[n].channel() for n in NODES}
    try:
        stubs = {n: stamp_pb2_grpc.StampServiceStub(c) for n, c in channels.items()}
        try:
            start(stubs, ssid_offset)
            deadline = time.monotonic() + RUN_S + 30
            while time.monotonic() < deadline and any_sender_running(stubs):
                time.sleep(0.1)
            time.sleep(0.5)  # the last replies: up to 3.1 ms through a relay
            results = {
                ssid: list(stubs[snode].GetStampSessionResults(results_request(ssid + ssid_offset)).results)
                for ssid, (_, _, (snode, _, _), _) in LINK_SESSIONS.items()
            }
            on_edges = edges.wait_for_phase(ssid_offset) if edges is not None else {}
        finally:
            for stub in stubs.values():
                stub.Reset(pb.ResetRequest())
    finally:
        for c in channels.values():
            c.close()
    out = {}
    tai_minus_utc_s = round((time.clock_gettime_ns(time.CLOCK_TAI) - time.time_ns()) / 1e9)
    for ssid, (link, fwd_dir, _, _) in LINK_SESSIONS.items():
        got = results[ssid]
        assert len(got) == int(RATE * RUN_S), (link, len(got))  # every probe answered
        window = relay_ground_truth(before[link], lab.relay_stats(link))
        late = {d: window[d]["lateness_us"]["p50"] for d in ("a_to_b", "b_to_a")}
        t = lab.topo.link(link)
        injected = {"a_to_b": t.delay_a_to_b_us, "b_to_a": t.delay_b_to_a_us}
        out[ssid] = {
            "fwd": statistics.median(r.forward_delay_ns for r in got) / 1000,
            "rev": statistics.median(r.reverse_delay_ns for r in got) / 1000,
            "want_fwd": injected[fwd_dir] + late[fwd_dir],
            "want_rev": injected[OTHER[fwd_dir]] + late[OTHER[fwd_dir]],
            **on_edges.get(ssid, {}),
        }
        for d, field in (("fwd", "forward_delay_ns"), ("rev", "reverse_delay_ns")):
            if f"edge_{d}_at_ns" in out[ssid]:  # the agent's own records of the second on the edge
                second = out[ssid][f"edge_{d}_at_ns"] // 1_000_000_000 + tai_minus_utc_s
                of_second = [getattr(r, field) for r in got if r.t1_ns // 1_000_000_000 == second]
                assert of_second, (link, d, second)
                out[ssid][f"edge_{d}_agent_us"] = statistics.fmean(of_second) / 1000
    return out


MODES = [pb.STAMP_REFLECTOR_MODE_XDP, pb.STAMP_REFLECTOR_MODE_USERSPACE]


def assert_link_delays(mesh, start, offset: int, label: str, edges=None) -> None:
    """A base phase (every link BASE_US each way), then the topology's delays: per link and
    direction, the measured change must be the injected change within TOLERANCE_US; with `edges`
    (a Pipeline), the change of the delay on the link's edge too."""
    main_delays = {
        link: (mesh.topo.link(link).delay_a_to_b_us, mesh.topo.link(link).delay_b_to_a_us)
        for link, *_ in LINK_SESSIONS.values()
    }
    try:
        for link in main_delays:
            mesh.set_delay(link, BASE_US, BASE_US)
        base = measured_phase(mesh, mesh.agents, start, offset, edges)
    finally:
        for link, (ab, ba) in main_delays.items():
            mesh.set_delay(link, ab, ba)
    main = measured_phase(mesh, mesh.agents, start, offset + 10, edges)
    errors = []
    for ssid, (link, fwd_dir, _, _) in LINK_SESSIONS.items():
        for d in ("fwd", "rev") if edges is None else ("fwd", "rev", "edge_fwd", "edge_rev"):
            if d.startswith("edge_"):
                # An edge holds the newest second's mean; the injected side is the run's median with the
                # run's median lateness, and one late second of a relay (a loaded machine) moved an edge
                # 170 us from it. So an edge must carry exactly the mean of the agent's own records of
                # that second: the pipeline changes nothing. The agent's records themselves are held
                # to TOLERANCE_US of the injected delays just above ("fwd", "rev").
                for phase_name, phase in (("base", base), ("main", main)):
                    exact = phase[ssid][d] - phase[ssid][f"{d}_agent_us"]
                    print(f"link STAMP {label} {link} {d} {phase_name}: edge {phase[ssid][d]:.3f} us, the agent's "
                          f"records of that second {phase[ssid][f'{d}_agent_us']:.3f} us")  # fmt: skip
                    if abs(exact) > EDGE_EXACT_US:
                        errors.append((link, d, phase_name, "edge - the agent's mean of its second", exact))
                continue
            want_key = f"want_{d}"
            got = main[ssid][d] - base[ssid][d]
            want = main[ssid][want_key] - base[ssid][want_key]
            print(
                f"link STAMP {label} {link} {fwd_dir if d == 'fwd' else OTHER[fwd_dir]} {d}: measured "
                f"{main[ssid][d]:.1f} us (change {got:.1f}), injected {main[ssid][want_key]:.1f} us "
                f"(change {want:.1f}), error {got - want:+.1f} us"
            )
            if abs(got - want) > TOLERANCE_US:
                errors.append((link, d, got, want))
    assert not errors, errors


@pytest.mark.parametrize("mode", MODES, ids=["xdp", "userspace"])
def test_each_link_delay_per_direction(mesh, agents, mode):
    offset = 100 if mode == pb.STAMP_REFLECTOR_MODE_XDP else 200
    assert_link_delays(mesh, by_agent_api(mode), offset, pb.StampReflectorMode.Name(mode))


def test_link_probes_applied_by_the_controller(mesh, agents):
    """controller/examples/mesh8_link_probes.yaml: the controller installs the links' End.X SIDs
    and creates the six sessions; the same per-direction check."""
    assert_link_delays(mesh, by_controller, 300, "controller")
    end_x = mesh.run("A", ["ip", "-6", "route", "show", "fc00:1::a1"], check=True).stdout
    assert "seg6local action End.X nh6 fc00:a1::2" in end_x and "dev a1" in end_x, end_x


# -- the same delays on the graph edges, through Kafka and the processors ---------------------------
EDGE_STABLE_S = 2.5  # no newer point for this long: the delay processor closed the run's last second
EDGE_WAIT_S = 40.0
EDGE_EXACT_US = 1.0  # an edge's mean against the agent's records of its second: the same numbers


def edge_keys() -> dict[int, tuple[str, str]]:
    """Per session, the keys of its link's edges (sender -> reflector, reflector -> sender), as the
    topology processor names them in own mode (model.link_key: Jalapeno's ls_link convention)."""
    ident, out = Identity(), {}
    for ssid, (_, _, (snode, _, saddr), (rnode, _, raddr)) in LINK_SESSIONS.items():
        key = f"{ident.protocol_id}_{ident.domain_id}_{ident.mt_id}_{ident.area_id}"
        out[ssid] = (f"{key}_{snode}_{saddr}_{rnode}_{raddr}", f"{key}_{rnode}_{raddr}_{snode}_{saddr}")
    return out


class Pipeline:
    """The delay and the topology processor on the stack's Kafka (the agents' default topics; their
    own consumer groups), the topology processor writing to an ArangoDB stand-in."""

    def __init__(self, kafka: str, run_dir: Path, arango: ArangoStandin):
        self.run_dir, self.arango, self.procs = run_dir, arango, {}
        self.phase_edges: dict[int, dict] = {}  # ssid offset -> the edges once that phase was steady
        run = uuid.uuid4().hex[:8]
        common = {"SEGSCOPE_KAFKA_BOOTSTRAP": kafka}
        self.spawn(
            "delay",
            {
                **common,
                "SEGSCOPE_DELAY_APP_ID": f"{PREFIX}-delay-{run}",
                "SEGSCOPE_DELAY_DATADIR": str(run_dir / "delay"),
            },
        )
        self.spawn(
            "topology",
            {
                **common,
                "SEGSCOPE_TOPOLOGY_APP_ID": f"{PREFIX}-topology-{run}",
                "SEGSCOPE_TOPOLOGY_DATADIR": str(run_dir / "topology"),
                "SEGSCOPE_ARANGO_URL": arango.url,
                "SEGSCOPE_ARANGO_USER": arango.user,
                "SEGSCOPE_ARANGO_PASSWORD": arango.password,
                "SEGSCOPE_ARANGO_DB": f"{PREFIX}_links",
            },
        )
        self.writer = None
        self.keys = edge_keys()

    def spawn(self, name: str, env: dict) -> None:
        log = open(self.run_dir / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", f"processors.{name}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, **env},
            start_new_session=True,
        )

    def stop(self) -> list[int]:
        codes = []
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
            try:
                codes.append(p.wait(timeout=20))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                codes.append(p.wait())
        return codes

    def edges(self) -> dict[str, dict]:
        if self.writer is None:
            self.writer = ArangoWriter(self.arango.url, f"{PREFIX}_links", self.arango.user, self.arango.password)
        try:
            return {d["_key"]: d for d in self.writer.all_documents("segscope_graph_edge")}
        except Exception:  # the processor has not created the database yet
            return {}

    def logs(self) -> str:
        return "".join((self.run_dir / f"{n}.log").read_text()[-1500:] for n in self.procs)

    def wait_for_phase(self, ssid_offset: int) -> dict[int, dict[str, float]]:
        """Per session, the STAMP delay on its link's two edges once every edge carries this
        phase's session (its own ssid) and none changed for EDGE_STABLE_S."""
        want = {k: ssid + ssid_offset for ssid, pair in self.keys.items() for k in pair}
        last, since, deadline = None, time.monotonic(), time.monotonic() + EDGE_WAIT_S
        while time.monotonic() < deadline:
            edges = self.edges()
            now = {k: (edges.get(k) or {}).get("stamp_link_delay") for k in want}
            if all(v is not None and v.get("ssid") == want[k] for k, v in now.items()):
                if now != last:
                    last, since = now, time.monotonic()
                elif time.monotonic() - since >= EDGE_STABLE_S:
                    # the edges as they were then: once the sessions are reset the processor takes
                    # their STAMP delay off the edges again, on a loaded machine before a later read
                    self.phase_edges[ssid_offset] = {k: edges[k] for k in want}
                    at = {k: edges[k]["stamp_link_delay_measured_at_ns"] for k in want}
                    return {
                        ssid: {
                            "edge_fwd": now[fwd]["mean_us"],
                            "edge_rev": now[rev]["mean_us"],
                            "edge_fwd_at_ns": at[fwd],
                            "edge_rev_at_ns": at[rev],
                        }
                        for ssid, (fwd, rev) in self.keys.items()
                    }
            time.sleep(0.5)
        raise AssertionError(f"edges never carried phase {ssid_offset}: {last or now}\n{self.logs()}")


@pytest.fixture(scope="module")
def pipeline(agents, stack, tmp_path_factory):
    with ArangoStandin() as arango:
        p = Pipeline(stack.kafka_bootstrap, tmp_path_factory.mktemp("link-pipeline"), arango)
        try:
            yield p
        finally:
            assert p.stop() == [0, 0], p.logs()


def test_link_probe_delays_on_the_edges(mesh, agents, pipeline):
    """Each link's STAMP delay per direction, through the agents' records on Kafka, the delay
    processor's stamp_delay and the topology processor's edge writes: on the edge of that link and
    direction (`stamp_link_delay`, which gives `unidir_link_delay`), its change from the base phase
    is the injected change within TOLERANCE_US, as the agents' own results are."""
    assert_link_delays(mesh, by_agent_api(pb.STAMP_REFLECTOR_MODE_XDP), 400, "edges", edges=pipeline)
    edges = pipeline.phase_edges[410]  # the main phase's edges, read while its sessions ran
    for ssid, (fwd, rev) in pipeline.keys.items():
        for key, direction in ((fwd, "forward"), (rev, "reverse")):
            e = edges[key]
            assert e["link_delay_source"] == "stamp" and e["unidir_link_delay"] == e["stamp_link_delay"]["mean_us"]
            assert (e["stamp_link_delay"]["ssid"], e["stamp_link_delay"]["direction"]) == (ssid + 410, direction)
