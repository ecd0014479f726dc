"""`candidates: {k_shortest: K}` of a steering entry: the K shortest paths by measured delay over
the topology graph, resolved when the intent is read (controller apply/run/plan/status, the steer).

A resolved path becomes a candidate like a listed one: its SID list is the End SID of each node it
crosses then the policy's own last SID (the egress's decapsulation SID); the probe comes back
over the same nodes (return_segs: their End SIDs reversed); the devices are the graph's
interfaces of the first link (sender_dev, on the policy's node) and of the last one
(reflector_dev, on the reflector node). Candidate i (k1, k2, ... by increasing delay) is measured
by STAMP session probe.ssid + i, as listed candidates are.

Re-resolution keeps the set still unless the graph says so clearly (CandidateSet): a path enters
the set only when it is better than the set's worst member by the entry's hysteresis (pct % and
us microseconds) in each of `seconds` consecutive readings; it takes that member's slot (its ssid),
so the other candidates keep their probes. The active path is never removed while it is active.

The graph: the topology processor's own-mode collections in ArangoDB, with the processor's
settings SEGSCOPE_ARANGO_URL / _USER / _PASSWORD / _DB (processors/topology/config.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from controller.steer.candidates import Graph, k_shortest, read_graph


class GraphError(Exception):
    """The graph cannot give the entry its candidates (unreachable, unknown node, no path)."""


@dataclass
class Topology:
    graph: Graph  # node -> {neighbour: measured one-way delay, us}
    end_sids: dict[str, str]  # node -> its End SID
    interfaces: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # link -> (local, remote)

    def nodes(self) -> set[str]:
        return set(self.graph) | {b for nbrs in self.graph.values() for b in nbrs}


@dataclass(frozen=True)
class ResolvedPath:
    nodes: tuple[str, ...]
    delay_us: float
    segs: tuple[str, ...]
    return_segs: tuple[str, ...]
    sender_dev: str
    reflector_dev: str


def without(graph: Graph, avoid) -> Graph:
    """The graph with the avoided nodes and every link to them taken out."""
    return {a: {b: w for b, w in nbrs.items() if b not in avoid} for a, nbrs in graph.items() if a not in avoid}


def ranked_paths(topo: Topology, src: str, dst: str, decap_sid: str, avoid=(), limit: int = 16) -> list[ResolvedPath]:
    """Every usable path from src to dst (up to `limit`), by increasing measured delay; a path through
    a node without an End SID, or whose end links have no interface name, is not usable."""
    for node, what in ((src, "policy's node"), (dst, "reflector node")):
        if node not in topo.nodes():
            raise GraphError(f"the {what} {node} is not in the topology graph (no measured link)")
    out = []
    for delay, path in k_shortest(without(topo.graph, set(avoid)), src, dst, limit):
        transit = path[1:-1]
        if any(n not in topo.end_sids for n in transit):
            continue
        sender_dev = topo.interfaces.get((path[0], path[1]), ("", ""))[0]
        reflector_dev = topo.interfaces.get((path[-2], path[-1]), ("", ""))[1]
        if not sender_dev or not reflector_dev:
            continue
        sids = tuple(topo.end_sids[n] for n in transit)
        out.append(ResolvedPath(tuple(path), delay, sids + (decap_sid,), sids[::-1], sender_dev, reflector_dev))
    return out


class CandidateSet:
    """The K paths an entry's candidates are, kept across graph readings with hysteresis."""

    def __init__(self, k: int, pct: float, us: float, seconds: int):
        self.k, self.pct, self.us, self.seconds = k, pct, us, seconds
        self.slots: list[ResolvedPath] = []  # slot i is measured by ssid probe.ssid + i
        self.streak: dict[tuple, int] = {}  # challenger's nodes -> consecutive readings it was clearly better

    def update(self, ranked: list[ResolvedPath], active_segs: tuple = ()) -> list[tuple[int, ResolvedPath]]:
        """One reading of the graph (ranked by delay); returns the slots that changed (slot, new path)."""
        if not self.slots:
            self.slots = list(ranked[: self.k])
            return list(enumerate(self.slots))
        now = {p.nodes: p for p in ranked}
        self.slots = [now.get(p.nodes, p) for p in self.slots]  # members carry the newest delays
        gone = {p.nodes for p in self.slots} - set(now)
        changed = []
        members = {p.nodes for p in self.slots}
        for challenger in (p for p in ranked if p.nodes not in members):
            slot = self._weakest_slot(gone, active_segs)
            if slot is None:
                break
            if self.slots[slot].nodes in gone or self._clearly_better(challenger, self.slots[slot]):
                self.streak[challenger.nodes] = self.streak.get(challenger.nodes, 0) + 1
            else:
                self.streak.pop(challenger.nodes, None)
                continue
            if self.slots[slot].nodes in gone or self.streak[challenger.nodes] >= self.seconds:
                gone.discard(self.slots[slot].nodes)
                self.slots[slot] = challenger
                self.streak.pop(challenger.nodes, None)
                members.add(challenger.nodes)
                changed.append((slot, challenger))
        for nodes in list(self.streak):  # a streak is consecutive: a challenger not seen now starts over
            if nodes not in now or nodes in members:
                self.streak.pop(nodes)
        return changed

    def _weakest_slot(self, gone: set, active_segs: tuple) -> int | None:
        """The slot a challenger would take: a path gone from the graph first, else the slowest;
        never the active one."""
        open_slots = [i for i, p in enumerate(self.slots) if p.segs != tuple(active_segs)]
        if not open_slots:
            return None
        return max(open_slots, key=lambda i: (self.slots[i].nodes in gone, self.slots[i].delay_us))

    def _clearly_better(self, new: ResolvedPath, old: ResolvedPath) -> bool:
        gain = old.delay_us - new.delay_us
        return gain >= self.us and gain >= old.delay_us * self.pct / 100


def graph_from_env() -> Topology:
    """The topology processor's graph in ArangoDB, with the processor's own settings."""
    from arango import ArangoClient

    url = os.environ.get("SEGSCOPE_ARANGO_URL", "http://127.0.0.1:8529")
    db_name = os.environ.get("SEGSCOPE_ARANGO_DB", "segscope")
    try:
        db = ArangoClient(hosts=url, request_timeout=10).db(
            db_name,
            username=os.environ.get("SEGSCOPE_ARANGO_USER", "root"),
            password=os.environ.get("SEGSCOPE_ARANGO_PASSWORD", ""),
        )
        interfaces: dict = {}
        graph, end_sids = read_graph(db, interfaces)
    except Exception as exc:  # connection refused, login, missing collection: all say the same
        raise GraphError(f"cannot read the topology graph from {url} (database {db_name}): {exc}") from None
    return Topology(graph, end_sids, interfaces)
