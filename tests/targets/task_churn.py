"""Target whose asyncio tasks come and go all the time (3.14+).

usage: task_churn.py READY_FILE

Spawners create short-lived tasks without end (about a thousand a second each, living a few
milliseconds: a busy server's requests), each named after the coroutine it runs:
"alpha-N" runs alpha(), "beta-N" runs beta() (a parent awaiting a child task
"beta-N/child" that runs beta_child()), "gamma-N" runs gamma() (gathering two
"gamma-N/part" tasks that run gamma_part()). Each does a little Python work and awaits a
little, so tasks are created, run, wait and finish between any two samples. A sample that
names a task must show that task's own coroutine right under the frame naming it: any
other is a stale or spliced chain. READY_FILE is written once every kind runs. Runs until
killed (or LIFETIME seconds).
"""

import asyncio
import os
import random
import signal
import sys

LIFETIME = 600


def work(n):
    return sum(i * i for i in range(n))


async def alpha():
    work(random.randint(10, 400))
    await asyncio.sleep(random.random() * 0.008)
    work(random.randint(10, 400))


async def beta_child():
    work(random.randint(10, 300))
    await asyncio.sleep(random.random() * 0.006)


async def beta(name):
    child = asyncio.create_task(beta_child(), name=name + "/child")
    await child
    work(random.randint(10, 200))


async def gamma_part():
    await asyncio.sleep(random.random() * 0.006)
    work(random.randint(10, 300))


async def gamma(name):
    parts = [asyncio.create_task(gamma_part(), name=name + "/part") for _ in range(2)]
    await asyncio.gather(*parts)


async def spawner(kind, started):
    n = 0
    pending = set()
    while True:
        n += 1
        name = "%s-%d" % (kind, n)
        if kind == "alpha":
            coro = alpha()
        elif kind == "beta":
            coro = beta(name)
        else:
            coro = gamma(name)
        task = asyncio.create_task(coro, name=name)
        pending.add(task)
        task.add_done_callback(pending.discard)
        started.add(kind)
        if len(pending) > 50:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.001)


async def main(ready):
    started = set()
    for kind in ("alpha", "beta", "gamma"):
        asyncio.create_task(spawner(kind, started), name="spawner-" + kind)
    while len(started) < 3:
        await asyncio.sleep(0.01)
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        f.write("ready\n")
    os.replace(tmp, ready)
    await asyncio.Event().wait()


if __name__ == "__main__":
    signal.alarm(LIFETIME)
    asyncio.run(main(sys.argv[1]))
