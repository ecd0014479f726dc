"""Compressed SIDs (RFC 9800 NEXT-C-SID, "uSID"): container arithmetic, pure.

A container is one IPv6 address: the locator block (lblen bits), then micro-SIDs of nflen bits
each, then zeros (the end-of-carrier). A NEXT-C-SID End at the node whose micro-SID is first
shifts the rest left by nflen bits; after the last shift the address is block + last micro-SID.

    fmt = CsidFormat.parse("fcbb:bbbb::/32", 16)
    fmt.pack([0x100, 0x200, 0x300])   -> "fcbb:bbbb:100:200:300::"
    fmt.shifts("fcbb:bbbb:100:200:300::") -> the address at each micro-SID's node, in order
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

DEFAULT_LBLEN, DEFAULT_NFLEN = 32, 16  # the kernel's defaults (F3216)


def length_problem(bits: int, what: str) -> str:
    """'' when a NEXT-C-SID length is one the kernel takes: a multiple of 8 in 8..120."""
    if bits % 8 or not 8 <= bits <= 120:
        return f"{what} {bits} bits: the kernel takes a multiple of 8 in 8..120"
    return ""


@dataclass(frozen=True)
class CsidFormat:
    block: ipaddress.IPv6Network  # the locator block; its length is lblen
    nflen: int  # micro-SID width in bits

    @classmethod
    def parse(cls, block: str, nflen: int = DEFAULT_NFLEN) -> "CsidFormat":
        return cls(ipaddress.IPv6Network(block), nflen)

    @property
    def lblen(self) -> int:
        return self.block.prefixlen

    @property
    def capacity(self) -> int:
        """How many micro-SIDs one container holds."""
        return (128 - self.lblen) // self.nflen

    def _slot_shift(self, index: int) -> int:
        return 128 - self.lblen - (index + 1) * self.nflen

    def in_block(self, addr: str) -> bool:
        return ipaddress.IPv6Address(addr) in self.block

    def pack(self, usids: list[int]) -> str:
        """The container carrying usids in travel order (caller checked count and widths)."""
        value = int(self.block.network_address)
        for i, usid in enumerate(usids):
            value |= usid << self._slot_shift(i)
        return str(ipaddress.IPv6Address(value))

    def unpack(self, addr: str) -> list[int]:
        """Every micro-SID slot of a container, zeros included."""
        value = int(ipaddress.IPv6Address(addr))
        mask = (1 << self.nflen) - 1
        return [(value >> self._slot_shift(i)) & mask for i in range(self.capacity)]

    def usids(self, addr: str) -> list[int]:
        """The micro-SIDs a container carries: the slots before the first zero."""
        slots = self.unpack(addr)
        return slots[: slots.index(0)] if 0 in slots else slots

    def container_problem(self, addr: str) -> str:
        """'' for a well-formed container; else what is wrong with it (a zero micro-SID before a
        non-zero one, which no node would ever shift in; bits after the last whole slot)."""
        slots = self.unpack(addr)
        carried = self.usids(addr)
        if any(slots[len(carried) :]):
            later = next(i for i in range(len(carried), len(slots)) if slots[i])
            return (
                f"micro-SID {len(carried) + 1} is zero (the end of the container) but micro-SID "
                f"{later + 1} ({slots[later]:x}) follows it: no node would reach it"
            )
        if not carried:
            return "carries no micro-SID (every slot after the block is zero)"
        spare = 128 - self.lblen - self.capacity * self.nflen
        if spare and int(ipaddress.IPv6Address(addr)) & ((1 << spare) - 1):
            return f"the last {spare} bits are not part of any {self.nflen}-bit micro-SID and must be zero"
        return ""

    def locator(self, usid: int) -> str:
        """The locator prefix (block + one micro-SID) a node installs its NEXT-C-SID SID on."""
        return f"{self.pack([usid])}/{self.lblen + self.nflen}"

    def shifts(self, addr: str) -> list[str]:
        """The destination address as each micro-SID's node sees it, in travel order: the first is
        the container itself, the last is block + the last micro-SID."""
        carried = self.usids(addr)
        return [self.pack(carried[i:]) for i in range(len(carried))]
