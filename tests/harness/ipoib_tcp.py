"""A TCP bulk transfer for the IPoIB namespace tests: ``serve PORT`` receives until EOF
and prints ``{"bytes": N, "sha256": H}``; ``send HOST PORT MIB`` sends MIB MiB of
deterministic pseudo-random data and prints the same for what it sent."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import sys

CHUNK = 1 << 20


def serve(port: int) -> None:
    family = socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", port))
        s.listen(1)
        print(json.dumps({"listening": port}), flush=True)
        conn, _ = s.accept()
        h = hashlib.sha256()
        n = 0
        with conn:
            conn.settimeout(120)
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    break
                h.update(data)
                n += len(data)
        print(json.dumps({"bytes": n, "sha256": h.hexdigest()}), flush=True)


def send(host: str, port: int, mib: int) -> None:
    rng = random.Random(4755)
    block = rng.randbytes(CHUNK)
    h = hashlib.sha256()
    with socket.create_connection((host, port), timeout=120) as s:
        for i in range(mib):
            data = bytes([i & 0xFF]) + block[1:]
            s.sendall(data)
            h.update(data)
    print(json.dumps({"bytes": mib * CHUNK, "sha256": h.hexdigest()}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
