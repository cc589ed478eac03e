#!/usr/bin/env python3
"""Independent computation of the golden RoCEv2 frames in sim/tests/roce_frames.rs.

Nothing here uses the Rust code: every frame is built from its field values with struct.pack,
and its ICRC with zlib.crc32 over the masked pseudo-header of RoCEv2 (8 bytes of FF, the IPv4
header with TOS, TTL and checksum set to FF, the UDP header with checksum FFFF, the BTH with byte
4 set to FF, then the rest of the packet), stored little-endian. If scapy is installed
(`pip install scapy`), each frame is also built with scapy's contrib/roce.py (its own IPv4
checksum and ICRC code) and must come out byte-identical; and scapy's third-party vectors are
checked with the same ICRC function.

Run: python3 sim/tests/roce_golden.py   (prints each frame as the hex the Rust test holds)
"""

import struct
import sys
import zlib

ROCE_PORT = 4791


def ipv4_checksum(h):
    s = sum(struct.unpack("!10H", h))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def ipv4(src, dst, total, ident=0, ttl=64, tos=0):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, tos, total, ident, 0x4000, ttl, 17, 0, bytes(src), bytes(dst))
    return h[:10] + struct.pack("!H", ipv4_checksum(h)) + h[12:]


def icrc(ip, udp, transport):
    ip = bytearray(ip)
    ip[1] = 0xFF
    ip[8] = 0xFF
    ip[10:12] = b"\xff\xff"
    udp = bytearray(udp)
    udp[6:8] = b"\xff\xff"
    t = bytearray(transport)
    t[4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(t)) & 0xFFFFFFFF


def bth(op, se, pad, dqp, ackreq, psn, pkey=0xFFFF):
    return struct.pack("!BBHII", op, se << 7 | pad << 4, pkey, dqp & 0xFFFFFF, ackreq << 31 | (psn & 0xFFFFFF))


def reth(va, rkey, length):
    return struct.pack("!QII", va, rkey, length)


def aeth(syndrome, msn=0):
    return struct.pack("!I", syndrome << 24 | msn)


def immdt(v):
    return struct.pack("!I", v)


def mac(fabric, nic):
    return bytes([0x02, (fabric >> 8) & 0xFF, fabric & 0xFF, (nic >> 16) & 0xFF, (nic >> 8) & 0xFF, nic & 0xFF])


def ip_of_nic(n):
    return bytes([10, (n >> 16) & 0xFF, (n >> 8) & 0xFF, n & 0xFF])


def sport(l, r):
    fl = l * r
    fl ^= fl >> 20
    fl ^= fl >> 40
    fl &= 0xFFFFF
    return 0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14))


def frame(op, se, ackreq, dqp, psn, ext, payload, src_ip, dst_ip, sp, src_mac, dst_mac, ident=0, ttl=64):
    pad = (-len(payload)) & 3
    transport = bth(op, se, pad, dqp, ackreq, psn) + ext + payload + b"\x00" * pad
    n = len(transport) + 4
    ip = ipv4(src_ip, dst_ip, 20 + 8 + n, ident, ttl)
    udp = struct.pack("!HHHH", sp, ROCE_PORT, 8 + n, 0)
    crc = icrc(ip, udp, transport)
    eth = dst_mac + src_mac + b"\x08\x00"
    return eth + ip + udp + transport + struct.pack("<I", crc), (op, se, pad, dqp, ackreq, psn, ext, payload,
                                                                src_ip, dst_ip, sp, src_mac, dst_mac, ident, ttl)


def sim(op, se, ackreq, dqp, psn, ext, payload, src=1, dst=2, lq=3, rq=4, fabric=1):
    return frame(op, se, ackreq, dqp, psn, ext, payload, ip_of_nic(src), ip_of_nic(dst), sport(lq, rq),
                 mac(fabric, src), mac(fabric, dst))


GOLDEN = {
    # rocev2.md section 5, worked example (other addresses than the sim's)
    "rocev2_md_send_only": frame(0x04, 0, 1, 0x12, 0, b"", b"abcd", [192, 0, 2, 1], [192, 0, 2, 2], 0xC132,
                                 bytes.fromhex("020000000001"), bytes.fromhex("020000000002"), 0x1234, 64),
    "send_only": sim(0x04, 1, 1, 4, 0x01ABCDEF, b"", b"hello"),
    "send_only_zero_length": sim(0x04, 0, 1, 4, 1, b"", b""),
    "send_only_imm": sim(0x05, 0, 1, 4, 7, immdt(0xDEADBEEF), b"imm!"),
    "write_first": sim(0x06, 0, 0, 4, 100, reth(0x00007F0012345000, 0x00ABCDEF, 10000), bytes(range(16))),
    "write_only_imm": sim(0x0B, 1, 1, 4, 0xFFFFFF, reth(0x2000, 0x77, 3) + immdt(0x01020304), b"xyz"),
    "read_request": sim(0x0C, 0, 1, 4, 200, reth(0x1000, 0x12345678, 8192), b""),
    "read_response_only": sim(0x10, 0, 0, 3, 200, aeth(0x1F), b"ABCDEFG", src=2, dst=1, lq=4, rq=3),
    "ack": sim(0x11, 0, 0, 3, 100, aeth(0x1F), b"", src=2, dst=1, lq=4, rq=3),
    "rnr_nak": sim(0x11, 0, 0, 3, 7, aeth(0x27), b"", src=2, dst=1, lq=4, rq=3),
    "nak_sequence": sim(0x11, 0, 0, 3, 0x0ABCDE, aeth(0x60), b"", src=2, dst=1, lq=4, rq=3),
}


def check_with_scapy():
    try:
        from scapy.compat import raw
        from scapy.contrib.roce import BTH
        from scapy.layers.inet import IP, UDP
        from scapy.layers.l2 import Ether
        from scapy.packet import Raw
    except ImportError:
        print("scapy not installed: checked with zlib only", file=sys.stderr)
        return
    for name, (b, f) in GOLDEN.items():
        op, se, pad, dqp, ackreq, psn, ext, payload, src_ip, dst_ip, sp, src_mac, dst_mac, ident, ttl = f
        p = (Ether(src=src_mac.hex(":"), dst=dst_mac.hex(":"))
             / IP(src=".".join(map(str, src_ip)), dst=".".join(map(str, dst_ip)), id=ident, flags="DF", ttl=ttl)
             / UDP(sport=sp, dport=ROCE_PORT, chksum=0)
             / BTH(opcode=op, solicited=se, padcount=pad, dqpn=dqp, ackreq=ackreq, psn=psn & 0xFFFFFF)
             / Raw(ext + payload + b"\x00" * pad))
        s = raw(p)
        assert s == b, f"{name}: scapy builds\n{s.hex()}\nzlib gives\n{b.hex()}"
    # Third-party vectors: scapy's test/contrib/roce.uts.
    # ConnectX-4 Lx CNP (a hardware capture): ICRC bytes 82 fd 00 2a.
    cnp = bytes.fromhex("e41d2dab2bc27cfe90643b32080045c2003c718c400040119161"
                        "0a0011010a001201000012b700280000" "8100ffff40000118" + "00" * 20 + "82fd002a")
    assert struct.pack("<I", icrc(cnp[14:34], cnp[34:42], cnp[42:-4])) == cnp[-4:]
    print("scapy: all frames identical; ConnectX-4 Lx CNP capture ICRC matches", file=sys.stderr)


if __name__ == "__main__":
    check_with_scapy()
    for name, (b, _) in GOLDEN.items():
        print(f"{name} ({len(b)} bytes):\n{b.hex()}")
