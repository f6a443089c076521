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


for _ in range(200):
    port = random.randrange(20000, 60000)
    if free(port) and free(port + 1):
        print(port)
        sys.exit(0)
sys.exit("free_ports.py: no two adjacent free ports found in 200 tries")
