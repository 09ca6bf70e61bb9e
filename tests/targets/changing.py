"""Target whose stacks change all the time, for the frame-cache consistency test: recursion
going up and down, calls that return and new calls at the same depth, generators resumed,
coroutines, and short-lived threads starting and ending. Writes ./ready when running."""
import asyncio
import os
import random
import threading
import time


def leaf(n):
    x = 0
    for i in range(50 + n):
        x += i
    return x


def down(n):
    if n == 0:
        return leaf(n)
    return down(n - 1) + 1


def same_depth_a():
    return leaf(1)


def same_depth_b():
    return leaf(2)


def recursion():
    while True:
        down(random.randint(0, 60))
        same_depth_a()
        same_depth_b()


def numbers(n):
    for i in range(n):
        yield leaf(i % 7)


def doubled(n):
    yield from (2 * x for x in numbers(n))


def generators():
    while True:
        for _ in doubled(random.randint(1, 30)):
            pass


async def hop(n):
    if n == 0:
        await asyncio.sleep(0)
        return leaf(3)
    return await hop(n - 1)


async def coroutines():
    while True:
        await asyncio.gather(*(hop(random.randint(0, 8)) for _ in range(3)))


def short_lived():
    down(random.randint(0, 20))
    time.sleep(random.uniform(0, 0.003))


def spawner():
    while True:
        threads = [threading.Thread(target=short_lived) for _ in range(random.randint(1, 4))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


for target in (recursion, generators, spawner):
    threading.Thread(target=target, daemon=True).start()
threading.Thread(target=lambda: asyncio.run(coroutines()), daemon=True).start()
with open("ready.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace("ready.tmp", "ready")
while True:
    time.sleep(1)
