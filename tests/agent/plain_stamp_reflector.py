"""A plain STAMP Session-Reflector, written for the tests from RFC 8762 §4.3 (unauthenticated,
stateless) and RFC 8972 §3 (the SSID echoed); no segscope code. A UDP socket on ADDRESS:PORT
answers every test packet with NTP timestamps (RFC 8762 §4.2.1, Z = 0) straight back to its
sender, plain IPv6 (no return path). Prints "ready" once bound; runs until killed.

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


def ntp_now() -> int:
    t = time.time_ns()
    sec, ns = divmod(t, 1_000_000_000)
    return ((sec + NTP_EPOCH_OFFSET) << 32) | (ns << 32) // 1_000_000_000


def hop_limit(ancillary) -> int:
    for level, kind, data in ancillary:
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_HOPLIMIT:
            return struct.unpack("i", data)[0]
    return 255


def main(address: str, port: int) -> None:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
    sock.bind((address, port))
    print("ready", flush=True)
    while True:
        data, ancillary, _, peer = sock.recvmsg(2048, socket.CMSG_SPACE(4))
        received = ntp_now()
        if len(data) < 44:
            continue  # RFC 8762 §4.2: a test packet is at least 44 bytes
        seq, sender_ts, sender_ee, ssid = TEST_PACKET.unpack_from(data)
        reply = REFLECTED.pack(
            seq, ntp_now(), ERROR_ESTIMATE, ssid, received, seq, sender_ts, sender_ee, 0, hop_limit(ancillary)
        )
        sock.sendto(reply + data[len(reply) :], peer)  # same length as the test packet


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
