"""Prints a port P such that P and P + 1 are both free on 127.0.0.1 now.

torchrun's static rendezvous serves its store on MASTER_PORT and braid's
ranks serve braid's on MASTER_PORT + 1 (runtime/rank_info.h), so a test
that starts torchrun needs both.
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


for _ in range(200):
    port = random.randrange(20000, 60000)
    if free(port) and free(port + 1):
        print(port)
        sys.exit(0)
sys.exit("free_ports.py: no two adjacent free ports found in 200 tries")
