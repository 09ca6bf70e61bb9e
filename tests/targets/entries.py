"""One worker thread started by `threading.Thread` whose work enters the eval loop anew in
every way it can: `Thread.run` calls the target through `*args, **kwargs` (3.11: a new eval
loop, the target an entry frame), the work calls through `*args, **kwargs` again, C calls
back into Python (`sorted` with a key, `map`), a generator resumed from C (`sum`), plus plain
recursion. Every instant of the worker has `work` on its stack and one of the functions below
`work` on top (a stack ending at `Thread.run` or `_bootstrap*` was cut).

usage: entries.py [SECONDS]

Prints "ready" (flushed) once the worker runs; the main thread waits on it, and exits after
SECONDS (default 300).
"""

import sys
import threading


def leaf(n):
    x = 0
    for i in range(n):
        x += i
    return x


def by_kwargs(*args, **kwargs):
    return leaf(*args, **kwargs)


def recurse(n):
    return leaf(20) if n == 0 else recurse(n - 1)


def keyed(v):
    return leaf(10) + v


def work(started):
    data = list(range(40))
    started.set()
    while True:
        by_kwargs(30)
        recurse(15)
        sorted(data, key=keyed)
        sum(leaf(5) for _ in range(20))
        list(map(keyed, data[:10]))


def main():
    lifetime = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0
    started = threading.Event()
    worker = threading.Thread(target=work, args=(started,), kwargs={}, name="worker", daemon=True)
    worker.start()
    started.wait()
    print("ready", flush=True)
    worker.join(lifetime)


if __name__ == "__main__":
    main()
