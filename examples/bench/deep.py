"""Benchmark workload: a 900-frame recursive stack that stays put.
Prints 'ready' when the stack is built; runs until killed."""
import sys
import threading

sys.setrecursionlimit(5000)
hold = threading.Event()


def down(n):
    if n == 0:
        print("ready", flush=True)
        hold.wait()
        return 0
    return down(n - 1) + 1


down(900 - 2)  # plus <module> and the waiting frame's callers: ~900 Python frames
