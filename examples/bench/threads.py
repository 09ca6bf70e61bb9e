"""Benchmark workload: 20 to 60 threads that come and go. Each thread recurses a little,
computes, sleeps a random short time and exits; the main thread keeps the count between 20
and 60. Prints 'ready' once 20 are running; runs until killed."""
import random
import threading
import time

LOW, HIGH = 20, 60
alive = threading.Semaphore(HIGH)


def nest(n, pause):
    if n == 0:
        x = 0
        for i in range(2000):
            x += i * i
        time.sleep(pause)
        return x
    return nest(n - 1, pause)


def worker():
    try:
        nest(random.randint(1, 30), random.uniform(0.01, 0.2))
    finally:
        alive.release()


ready = False
while True:
    alive.acquire()
    threading.Thread(target=worker, daemon=True).start()
    if not ready and threading.active_count() > LOW:
        print("ready", flush=True)
        ready = True
    if threading.active_count() > LOW:
        time.sleep(random.uniform(0.0, 0.01))
