"""Benchmark workload: one busy thread mixing recursion, math and short sleeps.
Prints 'ready' when running; runs until killed."""
import math
import threading
import time


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def work():
    while True:
        fib(16)
        sum(math.sqrt(i) for i in range(3000))
        time.sleep(0.0005)


threading.Thread(target=work, daemon=True, name="busy").start()
print("ready", flush=True)
while True:
    time.sleep(3600)
