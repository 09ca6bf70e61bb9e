"""A small mixed workload to point pyfleet at: a CPU-bound thread (recursion and math), a thread
that mostly sleeps, and a main thread waiting on both. Runs until killed."""
import math
import threading
import time


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def crunch():
    while True:
        fib(18)
        sum(math.sqrt(i) for i in range(2000))


def nap():
    while True:
        time.sleep(0.01)


def main():
    workers = [threading.Thread(target=f, name=f.__name__, daemon=True) for f in (crunch, nap)]
    for w in workers:
        w.start()
    print("busy.py running", flush=True)
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
