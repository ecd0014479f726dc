"""`steering:` entries of the intent: which SID list an SRv6 policy should use, chosen on what
segscope measures (docs/steering.md).

    steering:
      - node: A                                   # the policy's node (head end)
        destination: "fd00:b::/64"                # the policy (an entry of `policies:`)
        candidates:                               # the SID lists it may use, listed or
                                                  # {k_shortest: K, avoid: [node, ..]} (below)
          - {name: p1, segs: [...], return_segs: [...], sender_dev: a1, reflector_dev: b1}
            # probe_segs: the probe's SID list (default: segs without its last SID, the egress's
            # decapsulation SID; the probe goes to the reflector's address instead)
        probe: {ssid: 101, rate_pps: 20, source: "fc00:1::1",
                reflector: {node: B, address: "fc00:3::1"}}   # one STAMP session per candidate
        objective: lowest_delay                   # lowest_loss | {bounded: ..} (below)
        hysteresis: {pct: 10, us: 200, seconds: 5}
        hold_down_s: 30
        max_switches_per_hour: 6
        dry_run: false

`candidates: {k_shortest: K}`: the K shortest paths by measured delay over the topology graph,
resolved when the intent is read (controller/steer/resolve.py); `avoid` leaves nodes out.

Parsed with the intent's checker, so every problem is reported as FILE:LINE:COLUMN like the rest
of the file. Each candidate becomes a STAMP session (ssid = probe.ssid + its index) that the
controller creates like any other, so every candidate is measured all the time, not only the
active one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

OBJECTIVES = ("lowest_delay", "lowest_loss", "bounded")
DIRECTIONS = ("forward", "round_trip")
STEERING_KEYS = (
    "node",
    "destination",
    "table",
    "candidates",
    "probe",
    "objective",
    "hysteresis",
    "hold_down_s",
    "max_switches_per_hour",
    "stale_after_s",
    "verify_s",
    "dry_run",
)
CANDIDATE_KEYS = ("name", "segs", "probe_segs", "return_segs", "sender_dev", "reflector_dev")
PROBE_KEYS = ("ssid", "rate_pps", "source", "reflector", "direction")
PROBE_REFLECTOR_KEYS = ("node", "address")
OBJECTIVE_KEYS = ("kind", "max_delay_us", "max_loss_pct", "prefer")
HYSTERESIS_KEYS = ("pct", "us", "seconds", "loss_pp")
K_SHORTEST_KEYS = ("k_shortest", "avoid")
MIN_CANDIDATES = 2
MAX_CANDIDATES = 8
MAX_HYSTERESIS_S = 600


@dataclass(frozen=True)
class Candidate:
    name: str
    segs: tuple[str, ...]  # the policy's SID list when this candidate is active (travel order)
    ssid: int  # the STAMP session that measures it (probe.ssid + index)
    return_segs: tuple[str, ...] = ()
    sender_dev: str = ""  # where the probe's replies arrive on the policy's node
    probe_segs: tuple[str, ...] = ()  # the probe's SID list: segs without the egress's decap SID
    reflector_dev: str = ""  # where the probes arrive on the reflector node
    nodes: tuple[str, ...] = ()  # k_shortest: the graph's path (policy node ... reflector node)
    graph_delay_us: float | None = None  # k_shortest: the path's delay in the graph when resolved


@dataclass(frozen=True)
class Objective:
    kind: str  # lowest_delay | lowest_loss | bounded
    max_delay_us: float | None = None  # bounded: the limit; otherwise an alert threshold
    max_loss_pct: float | None = None
    prefer: tuple[str, ...] = ()  # bounded: candidate names, most preferred first


@dataclass(frozen=True)
class Hysteresis:
    pct: float = 10.0  # a candidate must be better by at least this % of the active's value ...
    us: float = 200.0  # ... and by at least this many microseconds (delay) ...
    seconds: int = 5  # ... in each of this many consecutive seconds
    loss_pp: float = 0.5  # lowest_loss: better by at least this many percentage points


@dataclass(frozen=True)
class Probe:
    ssid: int  # first candidate's STAMP ssid; candidate i uses ssid + i
    rate_pps: int
    source: str  # the policy node's STAMP source address
    reflector_node: str
    reflector_address: str
    direction: str = "forward"  # which stamp_delay direction is the candidate's delay


@dataclass(frozen=True)
class Steering:
    node: str
    destination: str  # canonical prefix
    table: int
    candidates: tuple[Candidate, ...]
    probe: Probe
    objective: Objective
    hysteresis: Hysteresis = Hysteresis()
    hold_down_s: float = 30.0
    max_switches_per_hour: int = 6
    stale_after_s: float = 3.0  # a candidate whose newest second is older than this is stale
    verify_s: int = 5  # seconds measured on the new path after a switch before it is judged
    dry_run: bool = False
    k_shortest: int = 0  # > 0: the candidates are the graph's K shortest paths, not listed
    avoid: tuple[str, ...] = ()  # k_shortest: nodes no candidate may cross

    @property
    def key(self) -> tuple:
        return (self.node, self.destination, self.table)

    @property
    def label(self) -> str:
        return f"{self.node}:{self.destination}" + (f":{self.table}" if self.table != 254 else "")

    def candidate(self, name: str) -> Candidate | None:
        return next((c for c in self.candidates if c.name == name), None)

    def candidate_for_segs(self, segs) -> Candidate | None:
        return next((c for c in self.candidates if c.segs == tuple(segs)), None)


def parse_steering(c, where: tuple, raw: Any, nodes: dict, policies: dict) -> Steering | None:
    """One `steering:` entry; problems go to the checker `c` (controller.intent._Checker)."""
    from controller.intent import MAIN_TABLE, MAX_RATE_PPS

    if not c.mapping(where, raw, STEERING_KEYS, required=("node", "destination", "candidates", "probe")):
        return None
    node = c.node_ref(where + ("node",), raw.get("node"), nodes) if "node" in raw else ""
    destination = c.prefix(where + ("destination",), raw.get("destination")) if "destination" in raw else ""
    table = c.integer(where + ("table",), raw["table"], "table", 1, 2**32 - 2) if "table" in raw else MAIN_TABLE
    if node and destination and (node, destination, table) not in policies:
        c.err(
            where + ("destination",),
            f"no policy for {destination} on node {node} (table {table}) under `policies:`",
            "add the policy under `policies:` (its segs: the candidate to start with), or fix node/destination",
        )
    k_shortest, avoid = 0, ()
    if isinstance(raw.get("candidates"), dict):
        k_shortest, avoid = _parse_k_shortest(c, where + ("candidates",), raw["candidates"], nodes)
        candidates = []
    else:
        candidates = _parse_candidates(c, where + ("candidates",), raw.get("candidates"), raw.get("probe"))
    probe = _parse_probe(c, where + ("probe",), raw.get("probe"), nodes, MAX_RATE_PPS) if "probe" in raw else None
    names = tuple(cand.name for cand in candidates)
    objective = _parse_objective(c, where + ("objective",), raw.get("objective", "lowest_delay"), names)
    hysteresis = _parse_hysteresis(c, where + ("hysteresis",), raw["hysteresis"]) if "hysteresis" in raw else None
    hold_down = _number(c, where + ("hold_down_s",), raw.get("hold_down_s", 30), 0, 86400, "hold_down_s")
    max_per_hour = (
        c.integer(where + ("max_switches_per_hour",), raw["max_switches_per_hour"], "max_switches_per_hour", 1, 3600)
        if "max_switches_per_hour" in raw
        else 6
    )
    stale = _number(c, where + ("stale_after_s",), raw.get("stale_after_s", 3), 1, 600, "stale_after_s")
    verify = c.integer(where + ("verify_s",), raw["verify_s"], "verify_s", 1, 600) if "verify_s" in raw else 5
    dry_run = c.boolean(where + ("dry_run",), raw["dry_run"]) if "dry_run" in raw else False
    if k_shortest and probe is not None and not c.doc.problems:
        policy = policies.get((node, destination, table))
        candidates = _resolve(c, where + ("candidates",), k_shortest, avoid, node, probe, policy, hysteresis)
    if probe is None or not candidates:
        return None
    candidates = tuple(replace(cand, ssid=probe.ssid + i) for i, cand in enumerate(candidates))
    return Steering(
        node=node,
        destination=destination,
        table=table,
        candidates=candidates,
        probe=probe,
        objective=objective,
        hysteresis=hysteresis or Hysteresis(),
        hold_down_s=hold_down,
        max_switches_per_hour=max_per_hour,
        stale_after_s=stale,
        verify_s=verify,
        dry_run=dry_run,
        k_shortest=k_shortest,
        avoid=avoid,
    )


def _parse_k_shortest(c, where: tuple, raw: dict, nodes: dict) -> tuple[int, tuple[str, ...]]:
    """`candidates: {k_shortest: K, avoid: [node, ...]}`."""
    if not c.mapping(where, raw, K_SHORTEST_KEYS, required=("k_shortest",)):
        return 0, ()
    k = (
        c.integer(where + ("k_shortest",), raw["k_shortest"], "k_shortest", MIN_CANDIDATES, MAX_CANDIDATES)
        if "k_shortest" in raw
        else 0
    )
    avoid = tuple(
        c.node_ref(where + ("avoid", i), name, nodes)
        for i, name in enumerate(c.listing(where + ("avoid",), raw.get("avoid"), "node"))
    )
    return k, avoid


def _resolve(c, where: tuple, k: int, avoid, node: str, probe: Probe, policy, hysteresis) -> list[Candidate]:
    """The graph's k shortest usable paths from the policy's node to the reflector node."""
    from controller.steer.resolve import CandidateSet, GraphError, ranked_paths

    if policy is None:
        return []
    h = hysteresis or Hysteresis()
    try:
        ranked = ranked_paths(c.topology(), node, probe.reflector_node, policy.segs[-1], avoid)
    except GraphError as exc:
        c.err(where, str(exc), "check the graph (SEGSCOPE_ARANGO_URL, the topology processor) or list the candidates")
        return []
    if len(ranked) < MIN_CANDIDATES:
        c.err(
            where,
            f"the topology graph has {len(ranked)} usable path(s) from {node} to {probe.reflector_node}"
            f"{' avoiding ' + ', '.join(avoid) if avoid else ''}: steering needs at least {MIN_CANDIDATES}",
            "measure more links (a path needs each link's delay and End SIDs on its transit nodes), or list them",
        )
        return []
    kept = CandidateSet(k, h.pct, h.us, h.seconds)
    kept.update(ranked)
    return [
        Candidate(
            f"k{i + 1}",
            p.segs,
            0,
            return_segs=p.return_segs,
            sender_dev=p.sender_dev,
            probe_segs=p.segs[:-1],
            reflector_dev=p.reflector_dev,
            nodes=p.nodes,
            graph_delay_us=p.delay_us,
        )
        for i, p in enumerate(kept.slots)
    ]


def _number(c, where: tuple, value: Any, lo: float, hi: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        c.err(where, f"{what} must be a number, got {value!r}", f"write a number in [{lo:g}, {hi:g}]")
        return float(lo)
    if not lo <= value <= hi:
        c.err(where, f"{what} {value:g} is out of range", f"write a number in [{lo:g}, {hi:g}]")
    return float(value)


def _parse_candidates(c, where: tuple, raw: Any, probe_raw: Any) -> list[Candidate]:
    items = c.listing(where, raw, "candidate")
    for i, item in enumerate(items):
        if isinstance(item, dict) and "k_shortest" in item:
            c.err(
                where + (i, "k_shortest"),
                "k_shortest among listed candidates: the candidates are either listed or the graph's K shortest",
                "write `candidates: {k_shortest: 3}` alone, or list every SID list without k_shortest",
                at_key=True,
            )
            return []
    if raw is not None and isinstance(raw, list) and len(items) < 2:
        c.err(
            where, f"{len(items)} candidate(s): steering needs at least 2", "list two or more SID lists to choose from"
        )
    if len(items) > MAX_CANDIDATES:
        c.err(where, f"{len(items)} candidates, at most {MAX_CANDIDATES}", f"keep the best {MAX_CANDIDATES}")
    out: list[Candidate] = []
    seen_names: dict[str, int] = {}
    seen_segs: dict[tuple, int] = {}
    for i, item in enumerate(items):
        here = where + (i,)
        if not c.mapping(here, item, CANDIDATE_KEYS, required=("name", "segs", "sender_dev", "reflector_dev")):
            continue
        name = c.string(here + ("name",), item.get("name"), "candidate name") if "name" in item else f"c{i}"
        segs = c.sid_list(here + ("segs",), item.get("segs"), allow_empty=False) if "segs" in item else ()
        back = c.sid_list(here + ("return_segs",), item.get("return_segs"), allow_empty=True)
        # the policy's last SID decapsulates at the egress (End.DT6 ...): a probe ends at the
        # reflector's address instead, so by default it carries the SIDs before that one
        probe = (
            c.sid_list(here + ("probe_segs",), item["probe_segs"], allow_empty=True)
            if "probe_segs" in item
            else segs[:-1]
        )
        sender_dev = c.ifname(here + ("sender_dev",), item["sender_dev"]) if "sender_dev" in item else ""
        refl_dev = c.ifname(here + ("reflector_dev",), item["reflector_dev"]) if "reflector_dev" in item else ""
        if name in seen_names:
            c.err(
                here + ("name",),
                f"candidate name {name!r} is also candidates[{seen_names[name]}]'s",
                "name each candidate once",
            )
        if segs and segs in seen_segs:
            c.err(here + ("segs",), f"same SID list as candidates[{seen_segs[segs]}]", "list each SID list once")
        seen_names.setdefault(name, i)
        seen_segs.setdefault(segs, i)
        out.append(
            Candidate(name, segs, 0, return_segs=back, sender_dev=sender_dev, probe_segs=probe, reflector_dev=refl_dev)
        )
    return out


def _parse_probe(c, where: tuple, raw: Any, nodes: dict, max_rate: int) -> Probe | None:
    if not c.mapping(where, raw, PROBE_KEYS, required=("ssid", "source", "reflector")):
        return None
    ssid = c.integer(where + ("ssid",), raw.get("ssid"), "ssid", 1, 65535 - MAX_CANDIDATES) if "ssid" in raw else 1
    rate = c.integer(where + ("rate_pps",), raw["rate_pps"], "rate_pps", 1, max_rate) if "rate_pps" in raw else 20
    source = c.ipv6(where + ("source",), raw.get("source")) if "source" in raw else ""
    direction = c.choice(where + ("direction",), raw.get("direction", "forward"), DIRECTIONS, "direction")
    refl = raw.get("reflector")
    node = address = ""
    if "reflector" in raw and c.mapping(
        where + ("reflector",), refl, PROBE_REFLECTOR_KEYS, required=("node", "address")
    ):
        node = c.node_ref(where + ("reflector", "node"), refl.get("node"), nodes) if "node" in refl else ""
        address = c.ipv6(where + ("reflector", "address"), refl.get("address")) if "address" in refl else ""
    return Probe(ssid, rate, source, node, address, direction)


def _parse_objective(c, where: tuple, raw: Any, names: tuple[str, ...]) -> Objective:
    if isinstance(raw, str):
        if raw == "bounded":
            c.err(
                where,
                "`bounded` needs its limits",
                "write `objective: {kind: bounded, max_delay_us: 5000, max_loss_pct: 1, prefer: [...]}`",
            )
        return Objective(c.choice(where, raw, OBJECTIVES, "objective"))
    if not c.mapping(where, raw, OBJECTIVE_KEYS, required=("kind",)):
        return Objective("lowest_delay")
    kind = c.choice(where + ("kind",), raw.get("kind"), OBJECTIVES, "objective") if "kind" in raw else "lowest_delay"
    max_delay = (
        _number(c, where + ("max_delay_us",), raw["max_delay_us"], 1, 1e7, "max_delay_us")
        if "max_delay_us" in raw
        else None
    )
    max_loss = (
        _number(c, where + ("max_loss_pct",), raw["max_loss_pct"], 0, 100, "max_loss_pct")
        if "max_loss_pct" in raw
        else None
    )
    prefer: tuple[str, ...] = ()
    if "prefer" in raw:
        listed = c.listing(where + ("prefer",), raw["prefer"], "candidate name")
        for i, name in enumerate(listed):
            if name not in names:
                c.err(where + ("prefer", i), f"unknown candidate {name!r}", f"use one of: {', '.join(names)}")
        prefer = tuple(str(n) for n in listed)
    if kind == "bounded":
        if max_delay is None and max_loss is None:
            c.err(
                where,
                "a bounded objective needs max_delay_us and/or max_loss_pct",
                "add `max_delay_us: 5000` or `max_loss_pct: 1`",
            )
        prefer = prefer + tuple(n for n in names if n not in prefer)  # the unlisted ones last, in file order
    elif "prefer" in raw:
        c.err(
            where + ("prefer",),
            f"`prefer` applies to the bounded objective, not to {kind}",
            "remove it, or write `kind: bounded`",
            at_key=True,
        )
    return Objective(kind, max_delay, max_loss, prefer)


def _parse_hysteresis(c, where: tuple, raw: Any) -> Hysteresis | None:
    if not c.mapping(where, raw, HYSTERESIS_KEYS):
        return None
    d = Hysteresis()
    return Hysteresis(
        pct=_number(c, where + ("pct",), raw.get("pct", d.pct), 0, 100, "pct"),
        us=_number(c, where + ("us",), raw.get("us", d.us), 0, 1e7, "us"),
        seconds=c.integer(where + ("seconds",), raw["seconds"], "seconds", 1, MAX_HYSTERESIS_S)
        if "seconds" in raw
        else d.seconds,
        loss_pp=_number(c, where + ("loss_pp",), raw.get("loss_pp", d.loss_pp), 0, 100, "loss_pp"),
    )


def describe_candidates(s: Steering) -> dict:
    """An entry's candidates as `controller validate` / `status` show them (JSON)."""
    return {
        "node": s.node,
        "policy": s.destination,
        "source": f"k_shortest {s.k_shortest}" if s.k_shortest else "listed",
        "candidates": [
            {"name": c.name, "ssid": c.ssid, "segs": list(c.segs)}
            | ({"nodes": list(c.nodes), "graph_delay_us": c.graph_delay_us} if c.nodes else {})
            for c in s.candidates
        ],
    }


def render_candidates(entry: dict) -> list[str]:
    """describe_candidates() as text lines."""
    lines = [f"  {entry['node']} {entry['policy']}: candidates {entry['source']}"]
    for c in entry["candidates"]:
        path = f"  path {'-'.join(c['nodes'])}, {c['graph_delay_us']:.0f} us in the graph" if "nodes" in c else ""
        lines.append(f"    {c['name']:<4} ssid {c['ssid']:<5} [{', '.join(c['segs'])}]{path}")
    return lines


def probe_sessions(s: Steering, stamp_session_cls, stamp_end_cls) -> list:
    """The STAMP sessions that measure the candidates (one per candidate), as intent entries."""
    return [
        stamp_session_cls(
            ssid=cand.ssid,
            sender=stamp_end_cls(s.node, s.probe.source, cand.sender_dev),
            reflector=stamp_end_cls(s.probe.reflector_node, s.probe.reflector_address, cand.reflector_dev),
            segs=cand.probe_segs,
            return_segs=cand.return_segs,
            rate_pps=s.probe.rate_pps,
        )
        for cand in s.candidates
    ]
