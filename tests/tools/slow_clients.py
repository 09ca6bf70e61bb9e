"""Slow clients for the listener test: COUNT connections to 127.0.0.1:PORT from SOURCE (an
address of 127/8), each sending half a request head and nothing more. After a second, writes
to OUT how many the server still holds open (the rest it closed at once), then holds them for
SECONDS (bounded: it always exits).

    slow_clients.py PORT SOURCE COUNT OUT SECONDS
"""
import os
import socket
import sys
import time

port, source, count, out, seconds = (
    int(sys.argv[1]),
    sys.argv[2],
    int(sys.argv[3]),
    sys.argv[4],
    float(sys.argv[5]),
)
held = []
for _ in range(count):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: pyfleet\r\n")
    except OSError:
        s.close()
        continue
    held.append(s)
time.sleep(1.0)
still_open = 0
for s in held:
    s.setblocking(False)
    try:
        closed = s.recv(1) == b""
    except BlockingIOError:
        closed = False
    except OSError:
        closed = True
    still_open += not closed
tmp = out + ".tmp"
with open(tmp, "w") as f:
    f.write(f"{still_open}\n")
os.rename(tmp, out)
time.sleep(seconds)
