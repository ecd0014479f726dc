"""A plain STAMP Session-Reflector, written for the tests from RFC 8762 §4.3 (unauthenticated,
stateless) and RFC 8972 §3 (the SSID echoed); no segscope code. A UDP socket on ADDRESS:PORT
answers every test packet with NTP timestamps (RFC 8762 §4.2.1, Z = 0) straight back to its
sender, plain IPv6 (no return path). Prints "ready" once bound; runs until killed.

The receive timestamp is the kernel's (SO_TIMESTAMPNS), as close to the wire as a socket gets:
taken in Python after recvmsg, it carried this process's scheduling delay into the forward delay
(a loaded 2-core runner measured a median 12.3 ms forward for 1.2 ms injected, the reverse right).
The transmit timestamp is taken just before the send.

    python plain_stamp_reflector.py fcbb:bbbb:400:: 862
"""

from __future__ import annotations

import socket
import struct
import sys
import time

NTP_EPOCH_OFFSET = 2_208_988_800  # seconds from 1900-01-01 to 1970-01-01
TEST_PACKET = struct.Struct("!IQHH")  # seq, timestamp, error estimate, SSID (the first 16 bytes)
# seq, timestamp, error estimate, SSID, receive timestamp, sender seq, sender timestamp,
# sender error estimate, MBZ, sender TTL, MBZ: 44 bytes
REFLECTED = struct.Struct("!IQHHQIQHHB3x")
ERROR_ESTIMATE = 0x8001  # S = 1 (synchronised), Z = 0 (NTP), scale 0, multiplier 1
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; the cmsg type is the same number
TIMESPEC = struct.Struct("qq")  # struct timespec on a 64-bit Linux: seconds, nanoseconds


def ntp(t_ns: int) -> int:
    sec, ns = divmod(t_ns, 1_000_000_000)
    return ((sec + NTP_EPOCH_OFFSET) << 32) | (ns << 32) // 1_000_000_000


def ntp_now() -> int:
    return ntp(time.time_ns())


def kernel_receive_time(ancillary) -> int | None:
    """The kernel's receive time of the packet (SCM_TIMESTAMPNS), NTP format; None without it."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            sec, ns = TIMESPEC.unpack_from(data)
            return ntp(sec * 1_000_000_000 + ns)
    return None


def hop_limit(ancillary) -> int:
    for level, kind, data in ancillary:
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_HOPLIMIT:
            return struct.unpack("i", data)[0]
    return 255


def main(address: str, port: int) -> None:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.bind((address, port))
    print("ready", flush=True)
    while True:
        data, ancillary, _, peer = sock.recvmsg(2048, socket.CMSG_SPACE(4) + socket.CMSG_SPACE(TIMESPEC.size))
        received = kernel_receive_time(ancillary) or ntp_now()
        if len(data) < 44:
            continue  # RFC 8762 §4.2: a test packet is at least 44 bytes
        seq, sender_ts, sender_ee, ssid = TEST_PACKET.unpack_from(data)
        reply = REFLECTED.pack(
            seq, ntp_now(), ERROR_ESTIMATE, ssid, received, seq, sender_ts, sender_ee, 0, hop_limit(ancillary)
        )
        sock.sendto(reply + data[len(reply) :], peer)  # same length as the test packet


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
