"""Routers' SRv6 SIDs as Jalapeno stores them, to expand uSID containers of routers without a
segscope agent (jalapeno mode).

Read from Jalapeno's ArangoDB: `ls_srv6_sid` documents are gobmp's LSSRv6SID messages as
gobmp-arango stores them (sbezverk/gobmp pkg/message/types.go): `srv6_sid`, `igp_router_id`,
`domain_id`, `srv6_endpoint_behavior`, and `srv6_sid_structure`, the BGP-LS SRv6 SID Structure TLV
(pkg/srv6/srv6-sid-structure-tlv.go SIDStructure: `locator_block_length`, `locator_node_length`,
`function_length`, `argument_length`, in bits). A SID belongs to the igp_node with the same
`igp_router_id` and `domain_id`, the join igp-graph makes itself (cisco-open/jalapeno
igp-graph/arangodb/srv6-processor.go addSRv6SIDToIGPNode); the node's `name` (the BGP-LS
hostname) is the name path documents use.

A container is expanded only from SIDs whose structure is complete and consistent; anything else
is reported with a reason (NOT_EXPANDED_REASONS), never guessed.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

STRUCTURE_FIELDS = ("locator_block_length", "locator_node_length", "function_length", "argument_length")
# why a SID could not be expanded (path documents' `unexpanded[].reason`, and one counter each)
NO_SID_STRUCTURE = "no_sid_structure"  # the router's SID has no srv6_sid_structure
SID_STRUCTURE_INCONSISTENT = "sid_structure_inconsistent"  # lengths that cannot describe the SID
NO_LOCATOR = "no_locator"  # no router's SID holds the address (after the shifts so far)
AMBIGUOUS_LOCATOR = "ambiguous_locator"  # several routers hold it, none of them the node before
NOT_EXPANDED_REASONS = (NO_SID_STRUCTURE, SID_STRUCTURE_INCONSISTENT, NO_LOCATOR, AMBIGUOUS_LOCATOR)
# a SID with a bad structure explains a micro-SID nobody holds when they share this many leading
# bits at least (a /32 block is the shortest in use; fewer would blame an unrelated router)
MIN_SHARED_BITS = 32


@dataclass(frozen=True)
class Locator:
    """One router's SID with a usable structure: the packet is that router's once the destination's
    first `match_bits` (block + node + function) equal the SID's."""

    node: str
    sid: int
    block_bits: int
    node_bits: int
    function_bits: int

    @property
    def match_bits(self) -> int:
        return self.block_bits + self.node_bits + self.function_bits

    def block(self) -> int:
        return _top(self.sid, self.block_bits)

    def holds(self, addr: int) -> bool:
        return _top(addr, self.match_bits) == _top(self.sid, self.match_bits)


@dataclass(frozen=True)
class BadSid:
    node: str
    sid: int
    reason: str
    detail: str


@dataclass
class Expansion:
    nodes: list[str] = field(default_factory=list)
    reason: str | None = None  # None: expanded
    detail: str = ""


def _top(value: int, bits: int) -> int:
    return value >> (128 - bits) << (128 - bits) if bits else 0


def _shared_bits(a: int, b: int) -> int:
    return 128 - (a ^ b).bit_length()


def _addr(value: int) -> str:
    return str(ipaddress.IPv6Address(value))


def structure_problem(structure) -> tuple[str, str] | None:
    """(reason, detail) when a srv6_sid_structure cannot describe a compressed SID, else None."""
    if structure is None:
        return NO_SID_STRUCTURE, "no srv6_sid_structure"
    if not isinstance(structure, dict):
        return SID_STRUCTURE_INCONSISTENT, f"srv6_sid_structure is {type(structure).__name__}, not an object"
    lengths = {f: structure.get(f) for f in STRUCTURE_FIELDS}
    bad = [f for f, v in lengths.items() if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 128]
    if bad:
        return SID_STRUCTURE_INCONSISTENT, f"{bad[0]} {lengths[bad[0]]!r} is not a bit length 0..128"
    lb, ln, fn, arg = (lengths[f] for f in STRUCTURE_FIELDS)
    if lb == 0 or ln == 0:
        return SID_STRUCTURE_INCONSISTENT, f"locator_block_length {lb}, locator_node_length {ln}: both must be > 0"
    if lb + ln + fn + arg > 128:
        return SID_STRUCTURE_INCONSISTENT, f"block {lb} + node {ln} + function {fn} + argument {arg} bits > 128"
    return None


@dataclass
class SidTable:
    locators: list[Locator] = field(default_factory=list)
    bad: list[BadSid] = field(default_factory=list)
    unnamed: int = 0  # SID documents of no igp_node with a name: nobody to name as a hop

    @classmethod
    def from_documents(cls, sid_docs: list[dict], node_docs: list[dict]) -> SidTable:
        names = {(n.get("igp_router_id"), n.get("domain_id")): n.get("name") for n in node_docs}
        table = cls()
        for doc in sid_docs:
            name = names.get((doc.get("igp_router_id"), doc.get("domain_id")))
            try:
                sid = int(ipaddress.IPv6Address(doc.get("srv6_sid") or ""))
            except ValueError:
                sid = None
            if not name or sid is None:
                table.unnamed += 1
                continue
            table.add(name, sid, doc.get("srv6_sid_structure"))
        return table

    def add(self, node: str, sid: int, structure) -> None:
        problem = structure_problem(structure)
        if problem is not None:
            self.bad.append(BadSid(node, sid, *problem))
            return
        lb, ln, fn = (structure[f] for f in STRUCTURE_FIELDS[:3])
        self.locators.append(Locator(node, sid, lb, ln, fn))

    def expand(self, container: str, previous: str) -> Expansion:
        """The routers a container visits, micro-SID by micro-SID, from the node before it; or the
        reason it cannot be told."""
        addr = int(ipaddress.IPv6Address(container))
        in_block = [loc for loc in self.locators if _top(addr, loc.block_bits) == loc.block()]
        if not in_block:
            return self._unheld(addr, f"{container}: no router's SRv6 SID has its locator block")
        widths = {(loc.block_bits, loc.node_bits) for loc in in_block}
        if len(widths) > 1:
            detail = ", ".join(f"{lb}/{ln}" for lb, ln in sorted(widths))
            return Expansion(
                reason=SID_STRUCTURE_INCONSISTENT,
                detail=f"{container}: SIDs of its block disagree on block/micro-SID lengths: {detail}",
            )
        lb, width = widths.pop()
        return self._walk(addr, lb, width, in_block, previous)

    def _walk(self, addr: int, lb: int, width: int, in_block: list[Locator], previous: str) -> Expansion:
        block, slots, mask = _top(addr, lb), (128 - lb) // width, (1 << width) - 1
        usids = [(addr >> (128 - lb - (i + 1) * width)) & mask for i in range(slots)]
        usids = usids[: usids.index(0)] if 0 in usids else usids
        out, i = Expansion(), 0
        while i < len(usids):
            dest = block | sum(u << (128 - lb - (j + 1) * width) for j, u in enumerate(usids[i:]))
            held = [loc for loc in in_block if loc.holds(dest)]
            longest = max((loc.match_bits for loc in held), default=0)
            owners = sorted({loc.node for loc in held if loc.match_bits == longest})
            if not owners:
                detail = f"micro-SID {usids[i]:x} ({_addr(dest)}): no router's SID holds it"
                return self._unheld(dest, detail, min_bits=lb + width)
            if len(owners) > 1 and previous not in owners:
                return Expansion(
                    reason=AMBIGUOUS_LOCATOR,
                    detail=f"micro-SID {usids[i]:x} ({_addr(dest)}) is held by {', '.join(owners)}",
                )
            previous = previous if previous in owners else owners[0]
            if not out.nodes or out.nodes[-1] != previous:
                out.nodes.append(previous)
            fn = next(loc.function_bits for loc in held if loc.match_bits == longest)
            i += 1 + fn // width  # a function micro-SID is that router's, executed there
        return out

    def _unheld(self, addr: int, detail: str, min_bits: int = MIN_SHARED_BITS) -> Expansion:
        """No usable SID holds addr: a SID with a bad structure that shares its first min_bits
        (the block and the micro-SID, when they are known) is the reason when there is one, else
        no router has a locator for it."""
        near = [b for b in self.bad if _shared_bits(b.sid, addr) >= min_bits]
        if near:
            b = max(near, key=lambda b: _shared_bits(b.sid, addr))
            return Expansion(reason=b.reason, detail=f"{detail}; {b.node}'s SID {_addr(b.sid)}: {b.detail}")
        return Expansion(reason=NO_LOCATOR, detail=detail)
