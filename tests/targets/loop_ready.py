"""Tasks in every state of readiness, frozen while the event loop's task spins (for
`dump --async` and wall recordings of ready tasks).

Started with OUT_DIR: once every task is where it should be, the main task blocks the loop
forever in `spin` and writes OUT_DIR/blocked. From then on, the loop runs nothing else:
- ready, waiting for the loop: "timer" (its asyncio.sleep's time has come), "threaded"
  (its asyncio.to_thread call returned: the loop's queue holds the hand-over), "woken" (the
  future it awaits is done), "stepping" (created, never run);
- pending: "forever" (awaits a future nothing completes), "later" (asyncio.sleep(3600));
- running: the main task, in `spin`.
"""

import asyncio
import os
import sys
import time


def waits_a_little():
    # Returns while the loop is blocked, not before.
    time.sleep(0.05)
    return 1


async def timer():
    await asyncio.sleep(0.01)


async def threaded():
    await asyncio.to_thread(waits_a_little)


async def awaits(future):
    await future


async def later():
    await asyncio.sleep(3600)


async def stepping():
    return 1


def spin():
    while True:
        pass


async def main(out_dir):
    loop = asyncio.get_running_loop()
    done, never = loop.create_future(), loop.create_future()
    tasks = [
        asyncio.create_task(timer(), name="timer"),
        asyncio.create_task(threaded(), name="threaded"),
        asyncio.create_task(awaits(done), name="woken"),
        asyncio.create_task(awaits(never), name="forever"),
        asyncio.create_task(later(), name="later"),
    ]
    # Each task reaches its await.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    done.set_result(1)
    tasks.append(asyncio.create_task(stepping(), name="stepping"))
    # The timer's time comes and the pool's call returns, while the loop waits here.
    time.sleep(0.2)
    with open(os.path.join(out_dir, "blocked"), "w") as f:
        f.write(str(os.getpid()))
    spin()


asyncio.run(main(sys.argv[1]))
