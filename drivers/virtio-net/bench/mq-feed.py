#!/usr/bin/env python3
"""Feed frames into the tap of bench/mq-check.sh (inside its private network namespace) so the
guest's multi-queue NIC receives on both queue pairs: UDP over IPv4 between loopback-range
addresses (127.0.0.1 -> 127.0.0.2) with varying source ports, which tun's flow hash spreads
over its queues. Stops after `seconds` (default 90) or when the tap goes away."""
import socket
import struct
import sys
import time

IF = "ubdmq0"
DST = bytes.fromhex("525400000009")
SRC = bytes.fromhex("020000000001")


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def frame(port):
    payload = b"ubdirect-mq" + bytes(50)
    udp = struct.pack("!HHHH", port, 9, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                     socket.inet_aton("127.0.0.1"), socket.inet_aton("127.0.0.2"))
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    return DST + SRC + b"\x08\x00" + ip + udp


def main():
    deadline = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 90)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    while True:
        try:
            s.bind((IF, 0))
            break
        except OSError:
            if time.time() > deadline:
                return
            time.sleep(0.1)
    frames = [frame(10000 + i) for i in range(64)]
    n = 0
    while time.time() < deadline:
        try:
            s.send(frames[n % len(frames)])
        except OSError:
            time.sleep(0.01)  # interface down or gone
        n += 1
        if n % 64 == 0:
            time.sleep(0.005)


main()
