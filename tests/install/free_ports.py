"""Prints a port P such that P and P + 1 are both free on 127.0.0.1 now.

A test hands P to a launcher as MASTER_PORT (torchrun's static rendezvous
serves its own store there); braid's store then starts on a port derived
from P and the job token and tries further ones where taken
(runtime/store_ports.h), so P + 1 being free only leaves room around P.
"""
import random
import socket
import sys


def free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ephemeral_range():
    """The kernel's range for outgoing connections' ports, which may take a
    port between this check and the launcher's bind: the pick stays out of it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


low, high = ephemeral_range()
candidates = [p for p in range(20000, 65535) if not (low - 1 <= p <= high)]
for _ in range(200):
    port = random.choice(candidates)
    if free(port) and free(port + 1):
        print(port)
        sys.exit(0)
sys.exit("free_ports.py: no two adjacent free ports found in 200 tries")
