"""HTTP load for the fleet test: N threads GET http://HOST:PORT/PATH (default /load) in a loop
until SECONDS have passed (bounded: it always stops). Prints the number of responses when done.

    load.py HOST PORT SECONDS [THREADS [PATH]]
"""
import sys
import threading
import time
import urllib.request

host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 4
path = sys.argv[5] if len(sys.argv) > 5 else "/load"
deadline = time.monotonic() + seconds
done = [0]
lock = threading.Lock()


def worker():
    url = f"http://{host}:{port}{path}"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                r.read()
            with lock:
                done[0] += 1
        except OSError:
            time.sleep(0.05)  # a worker was killed or is restarting


ts = [threading.Thread(target=worker) for _ in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(done[0], flush=True)
