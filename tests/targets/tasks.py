"""Target for `pyfleet dump --async`: a known graph of asyncio tasks, and the
interpreter's own view of it.

usage: tasks.py OUT_DIR

Builds, on CPython 3.14+:
- in the main thread's loop: the main task (unnamed: its name is the task
  counter's "Task-N"); a TaskGroup tree three levels deep ("top" -> "middle" ->
  "leaf-1", "leaf-2", and "leaf-3" under "top"); "gatherer", awaiting
  asyncio.gather() of two unnamed tasks (the gathered future is not a task: its
  children are awaited by "gatherer" through it); "deep", a chain of ten
  coroutines in one task; and "reporter", the running task, which writes the
  expectation and then blocks in a C call without leaving the task, so the
  loop never runs again;
- a second thread running its own loop with "side-1" and "side-2" waiting
  there (the thread waits in the selector: no task of it runs);
- "orphan", a pending task of a loop whose thread has ended (the interpreter's
  list holds it).

Once every task is where it stays, the reporter writes OUT_DIR/expected.json:

  {"pid": int, "version": [major, minor],
   "tasks": [{"id": id(task), "name": task.get_name(),
              "thread_id": the ident of the thread of its loop, or null when
                           that thread ended,
              "state": "running" | "pending",
              "frames": [{"function", "qualname", "file", "line"}, ...
                         innermost first: a pending task's coroutine chain
                         (cr_frame, then what cr_await holds, while it is a
                         coroutine), the running task's frames down to its
                         coroutine's],
              "awaited_by": [ids of the tasks awaiting it, looking through
                             futures that are not tasks]}]}

Runs until killed (or LIFETIME seconds).
"""

import asyncio
import json
import os
import signal
import sys
import threading
import time

LIFETIME = 600
_NEVER = threading.Lock()
_NEVER.acquire()


def fail(message):
    sys.stderr.write("TARGET FAILURE: %s\n" % message)
    sys.stderr.flush()
    os._exit(3)


def frame_dict(frame, line=None):
    code = frame.f_code
    return {
        "function": code.co_name,
        "qualname": code.co_qualname,
        "file": code.co_filename,
        "line": frame.f_lineno if line is None else line,
    }


def coroutine_chain(coro):
    """A pending task's frames, innermost first (as asyncio.graph builds them)."""
    frames = []
    while coro is not None and hasattr(coro, "cr_await"):
        if coro.cr_frame is None:
            break
        frames.append(frame_dict(coro.cr_frame))
        coro = coro.cr_await
    frames.reverse()
    return frames


def awaiting_tasks(fut, seen=None):
    """The tasks awaiting `fut`, looking through futures that are not tasks."""
    seen = set() if seen is None else seen
    out = []
    for waiter in fut._asyncio_awaited_by or ():
        if id(waiter) in seen:
            continue
        seen.add(id(waiter))
        if isinstance(waiter, asyncio.Task):
            out.append(id(waiter))
        else:
            out.extend(awaiting_tasks(waiter, seen))
    return sorted(out)


async def leaf(event):
    await event.wait()


async def middle(event):
    async with asyncio.TaskGroup() as tg:
        tg.create_task(leaf(event), name="leaf-1")
        tg.create_task(leaf(event), name="leaf-2")


async def top(event):
    async with asyncio.TaskGroup() as tg:
        tg.create_task(middle(event), name="middle")
        tg.create_task(leaf(event), name="leaf-3")


async def gatherer(event):
    await asyncio.gather(leaf(event), leaf(event))


async def deep(n, event):
    if n == 0:
        await event.wait()
    else:
        await deep(n - 1, event)


# The side thread's loop and the orphan's loop, with the ident of their thread
# (None once that thread has ended).
LOOPS = []


def side_thread(ready):
    async def side_main():
        event = asyncio.Event()
        asyncio.current_task().set_name("side-main")
        a = asyncio.create_task(leaf(event), name="side-1")
        b = asyncio.create_task(deep(2, event), name="side-2")
        LOOPS.append((asyncio.get_running_loop(), threading.get_ident()))
        ready.set()
        await asyncio.gather(a, b)

    asyncio.run(side_main())


def orphan_thread():
    loop = asyncio.new_event_loop()
    event = asyncio.Event()
    task = loop.create_task(leaf(event), name="orphan")
    loop.run_until_complete(asyncio.sleep(0.01))
    # The loop and its pending task outlive this thread.
    LOOPS.append((loop, None))
    ORPHANS.append((loop, event, task))


ORPHANS = []


def task_entry(task, loop_thread, running_frames=None):
    return {
        "id": id(task),
        "name": task.get_name(),
        "thread_id": loop_thread,
        "state": "running" if running_frames is not None else "pending",
        "frames": running_frames if running_frames is not None else coroutine_chain(task.get_coro()),
        "awaited_by": awaiting_tasks(task),
    }


def expectation(reporter, running_frames):
    main_loop = asyncio.get_running_loop()
    tasks = []
    loops = [(main_loop, threading.get_ident())] + LOOPS
    for loop, ident in loops:
        for task in asyncio.all_tasks(loop):
            running = running_frames if task is reporter else None
            tasks.append(task_entry(task, ident, running))
    tasks.sort(key=lambda t: t["id"])
    return {"pid": os.getpid(), "version": list(sys.version_info[:2]), "tasks": tasks}


def park_in_task(out_dir, reporter):
    """Writes the expectation, then blocks forever on the line after it: the
    running task's frames are this one (on PARK_LINE) and its callers down to
    the reporter's coroutine."""
    here = sys._getframe()
    frames = [frame_dict(here, PARK_LINE)]
    caller = here.f_back
    coro_frame = reporter.get_coro().cr_frame
    while caller is not None:
        frames.append(frame_dict(caller))
        if caller is coro_frame:
            break
        caller = caller.f_back
    else:
        fail("the reporter's coroutine frame is not on its stack")
    first = expectation(reporter, frames)
    time.sleep(0.05)
    second = expectation(reporter, frames)
    if first != second:
        fail("the tasks moved while settled:\n%r\n%r" % (first, second))
    write_json_atomic(os.path.join(out_dir, "expected.json"), second)
    _NEVER.acquire()
    fail("unreachable")


PARK_LINE = park_in_task.__code__.co_firstlineno + 21


def check_source():
    import linecache

    text = linecache.getline(__file__, PARK_LINE).strip()
    if text != "_NEVER.acquire()":
        fail("PARK_LINE %d is %r, not the blocking call" % (PARK_LINE, text))


def write_json_atomic(path, obj):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1, sort_keys=True)
    os.replace(tmp, path)


async def reporter(out_dir, expected_tasks):
    me = asyncio.current_task()
    # Every other task starts and reaches its await within a few loop turns.
    deadline = time.monotonic() + 30
    while True:
        await asyncio.sleep(0.05)
        settled = [
            t for t in asyncio.all_tasks() if t is not me and not t.done() and t.get_coro().cr_await is not None
        ]
        if len(settled) >= expected_tasks:
            break
        if time.monotonic() > deadline:
            fail("only %d of %d tasks settled" % (len(settled), expected_tasks))
    await asyncio.sleep(0.1)
    park_in_task(out_dir, me)


async def main(out_dir):
    event = asyncio.Event()
    asyncio.create_task(top(event), name="top")
    asyncio.create_task(gatherer(event), name="gatherer")
    asyncio.create_task(deep(10, event), name="deep")
    # main, top, middle, leaf-1..3, gatherer and its two children, deep.
    asyncio.create_task(reporter(out_dir, 10), name="reporter")
    await event.wait()


def run():
    if sys.version_info < (3, 14):
        fail("tasks.py needs Python 3.14+")
    check_source()
    signal.alarm(LIFETIME)
    out_dir = sys.argv[1]
    ready = threading.Event()
    threading.Thread(target=side_thread, args=(ready,), name="side-loop", daemon=True).start()
    if not ready.wait(30):
        fail("the side loop did not start")
    orphan = threading.Thread(target=orphan_thread, name="orphan-maker")
    orphan.start()
    orphan.join()
    asyncio.run(main(out_dir))


if __name__ == "__main__":
    run()
