#!/usr/bin/env python3
"""A network link with delay and loss, for kernels without tc netem.

    link_emulator.py HOST_SIDE SWITCH_SIDE --delay-ms D --loss PERCENT [--seed S]

Forwards every Ethernet frame between two interfaces of the namespace it runs in. Frames that
arrive on HOST_SIDE (what the host sends) leave on SWITCH_SIDE DELAY ms later, and each is dropped
with probability PERCENT/100 first: the same as `tc qdisc add dev eth0 root netem delay Dms loss
P%` on the host's own interface, which also acts on what the host sends only. Frames from
SWITCH_SIDE pass to HOST_SIDE at once. Stops on SIGTERM. The harness (hosts.sh) turns checksum
and segmentation offloads off on the host's interface, so every frame is whole and checksummed.
"""
import argparse
import heapq
import random
import select
import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003


def open_raw(interface):
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((interface, 0))
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    return sock


def send(sock, frame):
    """Passes a frame on; a full transmit queue drops it, as a real link would."""
    try:
        sock.send(frame)
    except (BlockingIOError, OSError):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host_side")
    parser.add_argument("switch_side")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0, help="percent of the host's frames dropped")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not 0 <= args.loss < 100 or args.delay_ms < 0:
        sys.exit(f"link_emulator: --loss must be in [0, 100) and --delay-ms >= 0, got {args.loss} and {args.delay_ms}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    chance = random.Random(args.seed)
    host, switch = open_raw(args.host_side), open_raw(args.switch_side)
    delay, loss = args.delay_ms / 1000.0, args.loss / 100.0
    pending = []  # (due time, order, frame) of the host's frames on their way to the switch
    order = 0
    print(f"link_emulator: {args.host_side} -> {args.switch_side}: delay {args.delay_ms} ms, loss {args.loss} %",
          flush=True)
    while True:
        wait = None if not pending else max(0.0, pending[0][0] - time.monotonic())
        readable, _, _ = select.select([host, switch], [], [], wait)
        for sock in readable:
            while True:
                try:
                    frame, address = sock.recvfrom(65536)
                except BlockingIOError:
                    break
                if address[2] == socket.PACKET_OUTGOING:
                    continue  # a frame this emulator sent
                if sock is switch:
                    send(host, frame)
                elif chance.random() >= loss:
                    heapq.heappush(pending, (time.monotonic() + delay, order, frame))
                    order += 1
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            send(switch, heapq.heappop(pending)[2])


if __name__ == "__main__":
    main()
