"""Which hops a trace measures, and their names: the pure core of inline_hop_delay's tags.

One `Signature` is what the records of a flow share when they took the same way: the node entries
of the trace without their timestamps (node id, hop limit, ingress and egress interface id, in path
order), the egress node's id, arrival hop limit and device. `resolve()` turns it, with what the
processor knows from segscope.paths (a `Book`: processors/paths.py PathBook), into a `Plan`: the
hops of the path in order, each with its tags and the two time rows whose difference is its delay,
or none (not measured). The rules (schemas/metrics.md, inline_hop_delay, says the same for users):

Nodes. The path is the ingress edge (the trace's oldest entry), the transit nodes that filled an
entry (in the order they met the packet), and the egress edge (the batch's node). A node id is named
by the `ioam/<node>` record that claims it; the ingress, when none does, by the flow's in-line tx
record (the agent that inserts the trace); otherwise `node-<id>`. The egress is the batch header's
node (the streamer's --node).

Nodes that did not fill (no IOAM, IOAM off on their ingress device, not in the namespace, no room
left: Overflow) are found two ways, and the larger count of the two wins per gap:
- by name, when the flow's path is known: the owners of its SIDs (the in-line tx record's SID list,
  each SID's owner from the `sids` of the ioam records), in order, without the two edges; an owner
  that is not in the trace is missing, placed in the gap before the next owner that is (or before
  the egress);
- by hop limit, always: each router decrements the hop limit once. A transit entry holds the hop
  limit the node forwards with (the kernel writes the arrival value - 1), the ingress entry the
  hop limit the packet leaves with (schemas/IOAM.md), the record the hop limit on arrival at the
  egress; so between two entries h1 and h2, h1 - h2 - 1 routers did not fill, and between the last
  entry h and the egress, h - arrival. A gap that is negative or above MAX_GAP is not believed
  (counted: hop_limit_inconsistent_records) and only named nodes count there. Unnamed missing
  nodes are called `unknown` and come after the named ones of their gap (their order is unknown).

Hops. hop i goes from the i-th node of that path (missing nodes included) to the next: hop 0 leaves
the ingress, the last one reaches the egress. A hop between two nodes that filled (or the edges)
is measured: from the earlier node's time to the later's (the ingress: the E2E option's transmit
time, ns; a transit node: its entry's receive time, UTC s + µs, made TAI with the record's
tai_utc_offset_s; the egress: the record's receive time, ns). A hop to or from a missing node is
not measured (a point with measured=false). Around every run of missing nodes a span is measured
too: from the node before the run to the node after it, `hop=<first>-<last>` (the hops it covers).

Interfaces. to_if is the next node's ingress interface (its entry's ingress id; at the egress, the
device of the record's ifindex). from_if is:
- at the ingress edge, its entry's egress id (segscope's TC program writes the device it sends on);
- at a transit node, the device that shares an IPv6 prefix with the next node's ingress device
  (both ioam records list their devices' prefixes);
- else, at a transit node that owns none of the flow's SIDs (the ioam record's `sids` and the
  flow's path say so), its entry's egress id: the kernel's route lookup toward the destination;
- else `unknown` (counted: hop_from_if_unresolved): at an SRv6 endpoint the kernel fills the
  egress id from the SID route's device, often the interface the packet came in on.
An interface id is named by its node's ioam record (the device name), else written as the decimal
IOAM id; 0xffff (unavailable) is `unknown`; the egress device without a record `ifindex-<n>`.
link = "<from_node>:<from_if>-><to_node>:<to_if>": directional, so the two directions of a link
are two series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from processors.delay.aggregate import escape_tag
from segscope_schemas import path_record as pr
from segscope_schemas.ioam_record import IOAM_IF_ID_UNAVAILABLE

UNKNOWN = "unknown"
MAX_GAP = 32  # routers between two entries beyond which the hop limits are not believed

# rows of an accumulated chunk (processors/inline/aggregate.py): a plan's time rows refer to them
SEQ, RX, TX, FLAGS, SIG = 0, 1, 2, 3, 4
FIRST_TRANSIT = 5  # transit node k (1 = the first after the ingress) is row FIRST_TRANSIT + k - 1


class Book(Protocol):
    """What resolve() asks of the paths it knows (processors/paths.py PathBook has these)."""

    def node_name(self, node_id: int) -> str | None: ...

    def ioam_node(self, name: str) -> pr.IoamNode | None: ...

    def sid_owner(self, sid: str) -> str | None: ...

    def inline_tx(self, flow_id: int, tx_node: str | None = None) -> pr.PathRecord | None: ...


class NoBook:
    """A Book that knows nothing: every name from the ids (tests, and a processor without paths)."""

    def node_name(self, node_id: int) -> str | None:
        return None

    def ioam_node(self, name: str) -> pr.IoamNode | None:
        return None

    def sid_owner(self, sid: str) -> str | None:
        return None

    def inline_tx(self, flow_id: int, tx_node: str | None = None) -> pr.PathRecord | None:
        return None


@dataclass(frozen=True)
class Entry:
    """One node entry of a trace without its timestamp, host order."""

    node_id: int
    hop_limit: int
    ingress_if: int
    egress_if: int


@dataclass(frozen=True)
class Signature:
    """What the records of one way through the network share (processors/inline/aggregate.py makes
    them from the record fields, one per distinct set)."""

    entries: tuple[Entry, ...]  # path order: the ingress edge first
    egress_node_id: int
    arrival_hop_limit: int
    ifindex: int
    truncated: bool  # the oldest entries were not copied: no ingress entry, no hops


@dataclass(frozen=True)
class Hop:
    tags: str  # escaped: hop=..,link=..,from_node=..,to_node=..,from_if=..,to_if=..
    start: int | None  # chunk row of the time it leaves the earlier node; None: not measured
    end: int | None  # chunk row of the time it reaches the later node
    from_if_unresolved: bool = False  # from_if is `unknown` at a transit node (rule 4 of the module doc)


@dataclass
class Plan:
    ingress: str  # the ingress node's name (the `ingress` tag)
    ingress_known: bool  # named by a record, not node-<id>
    path: str | None  # the flow's path tag (its in-line tx record), None if not known
    hops: list[Hop] = field(default_factory=list)
    hop_limit_inconsistent: bool = False


@dataclass
class _Node:
    name: str
    entry: Entry | None  # None: missing, or the egress
    row: int | None  # chunk row of its time; None: missing
    transit: bool = False
    egress: bool = False


def _devices(book: Book, name: str) -> tuple[dict[int, pr.IoamInterface], dict[int, pr.IoamInterface]]:
    rec = book.ioam_node(name)
    if rec is None:
        return {}, {}
    return {i.if_id: i for i in rec.interfaces}, {i.ifindex: i for i in rec.interfaces if i.ifindex is not None}


def _if_name(book: Book, node: str, if_id: int) -> str:
    if if_id == IOAM_IF_ID_UNAVAILABLE:
        return UNKNOWN
    by_id, _ = _devices(book, node)
    dev = by_id.get(if_id)
    return dev.device if dev is not None else str(if_id)


def hop_limit_gaps(sig: Signature) -> list[int | None]:
    """Routers between each two consecutive trace nodes (the egress last) that did not fill, from
    the hop limits; None where the hop limits are not believed (negative, or above MAX_GAP)."""
    if sig.truncated:
        return []
    limits = [e.hop_limit for e in sig.entries]
    gaps = [a - b - 1 for a, b in zip(limits, limits[1:])] + [limits[-1] - sig.arrival_hop_limit]
    return [g if 0 <= g <= MAX_GAP else None for g in gaps]


def resolve(sig: Signature, egress: str, flow_id: int, book: Book) -> Plan:
    """The hops of one signature of flow `flow_id` (received at node `egress`), named with `book`."""
    if sig.truncated:  # the ingress entry was not copied: no hop can be placed
        tx = book.inline_tx(flow_id)
        return Plan(ingress=tx.node if tx else UNKNOWN, ingress_known=tx is not None, path=_path(tx))
    ingress_entry, transit = sig.entries[0], sig.entries[1:]
    ingress = book.node_name(ingress_entry.node_id)
    tx_record = book.inline_tx(flow_id, ingress)
    known = ingress is not None or tx_record is not None
    if ingress is None:
        ingress = tx_record.node if tx_record is not None else f"node-{ingress_entry.node_id}"
    plan = Plan(ingress=ingress, ingress_known=known, path=_path(tx_record))
    observed = [_Node(ingress, ingress_entry, TX)]
    for k, e in enumerate(transit, start=1):
        observed.append(_Node(book.node_name(e.node_id) or f"node-{e.node_id}", e, FIRST_TRANSIT + k - 1, transit=True))
    observed.append(_Node(egress, None, RX, egress=True))

    # named missing nodes: SID owners not in the trace, each in the gap before the next one that is
    flow_sids: set[str] = set(tx_record.path) if tx_record is not None else set()
    expected: list[str] = []
    if tx_record is not None:
        for sid in tx_record.path:
            owner = book.sid_owner(sid)
            if owner is not None and (not expected or expected[-1] != owner):
                expected.append(owner)
    seen = {n.name: i for i, n in enumerate(observed) if n.transit}
    expected = [e for e in expected if e not in (ingress, egress)]
    named: dict[int, list[str]] = {}  # gap i (before observed[i]) -> missing names, in path order
    waiting: list[str] = []
    for name in expected:
        if name in seen:
            if waiting:
                named.setdefault(seen[name], []).extend(waiting)
                waiting = []
        elif name not in waiting:
            waiting.append(name)
    if waiting:
        named.setdefault(len(observed) - 1, []).extend(waiting)

    path_nodes: list[_Node] = [observed[0]]
    runs: list[tuple[int, int]] = []  # (index in path_nodes of the node before a run, after it)
    for i, gap in enumerate(hop_limit_gaps(sig), start=1):
        nxt = observed[i]
        if gap is None:
            plan.hop_limit_inconsistent = True
            gap = 0
        names = named.get(i, [])
        missing = names + [UNKNOWN] * max(0, gap - len(names))
        before = len(path_nodes) - 1
        path_nodes += [_Node(n, None, None) for n in missing]
        path_nodes.append(nxt)
        if missing:
            runs.append((before, len(path_nodes) - 1))

    def arrival_if(node: _Node) -> tuple[str, pr.IoamInterface | None]:
        """(to_if name, its device record if known) of the interface `node` receives on."""
        if node.egress:
            _, by_index = _devices(book, node.name)
            dev = by_index.get(sig.ifindex)
            return (dev.device, dev) if dev is not None else (f"ifindex-{sig.ifindex}", None)
        if node.entry is None:
            return UNKNOWN, None
        by_id, _ = _devices(book, node.name)
        dev = by_id.get(node.entry.ingress_if)
        return (dev.device, dev) if dev is not None else (_if_name(book, node.name, node.entry.ingress_if), None)

    def departure_if(node: _Node, nxt: _Node) -> tuple[str, bool]:
        """(from_if, whether it is `unknown` for want of a rule at a transit node)."""
        if node.entry is None:
            return UNKNOWN, False
        if not node.transit:  # the ingress edge: its own program wrote the device it sends on
            return _if_name(book, node.name, node.entry.egress_if), False
        _, arrival = arrival_if(nxt)
        rec = book.ioam_node(node.name)
        if rec is not None and arrival is not None and arrival.prefixes:
            shared = [i.device for i in rec.interfaces if set(i.prefixes) & set(arrival.prefixes)]
            if len(shared) == 1:
                return shared[0], False
        if rec is not None and tx_record is not None and not set(rec.sids) & flow_sids:
            return _if_name(book, node.name, node.entry.egress_if), False  # no endpoint: routed to the destination
        return UNKNOWN, True

    def hop(label: str, a: _Node, b: _Node, measured: bool) -> Hop:
        (from_if, unresolved), (to_if, _) = departure_if(a, b), arrival_if(b)
        tags = (
            f"hop={label},link={escape_tag(f'{a.name}:{from_if}->{b.name}:{to_if}')},from_node={escape_tag(a.name)},"
            f"to_node={escape_tag(b.name)},from_if={escape_tag(from_if)},to_if={escape_tag(to_if)}"
        )
        return Hop(tags, a.row if measured else None, b.row if measured else None, unresolved)

    for i in range(len(path_nodes) - 1):
        a, b = path_nodes[i], path_nodes[i + 1]
        plan.hops.append(hop(str(i), a, b, a.row is not None and b.row is not None))
    for before, after in runs:
        plan.hops.append(hop(f"{before}-{after - 1}", path_nodes[before], path_nodes[after], True))
    return plan


def _path(tx_record: pr.PathRecord | None) -> str | None:
    return pr.path_tag(tx_record) if tx_record is not None else None
