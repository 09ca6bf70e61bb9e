"""A Starlette service for the request-shaped asyncio views (`record --async --async-mode all`),
served by uvicorn with workers, each timing its own requests per phase.

Endpoints:
- /orders: `fetch_orders_from_db` (awaits a database stand-in: asyncio.sleep), `asyncio.to_thread`
  of a blocking client (`call_pricing_service`: time.sleep), then `serialise` (Python work on
  the event loop);
- /report: `build_report`, Python work on the event loop that every other request waits for;
- /stats: this worker's pid, the seconds its /orders requests spent so far, in all and per
  phase, its /report requests' CPU seconds in `build_report`, its event loop's thread's
  CPU seconds, and the seconds /orders requests were ready but waited for the loop, in all
  and while it ran `build_report` ({"pid": ..., "orders": {"total": s, "db": s, "pool": s,
  "serialise": s}, "count": {...}, "report": {"seconds": s}, "loop_cpu": s,
  "ready": {"total": s, "report": s}}).

Ready, waiting for the loop: from when the database stand-in's sleep was due, or the pool's
call returned, to when the request ran again. The overlap with `build_report`'s runs (their
start and end, kept) is the part the loop spent in it.
"""

import asyncio
import collections
import json
import os
import time

from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

SPENT = {"total": 0.0, "db": 0.0, "pool": 0.0, "serialise": 0.0}
COUNT = {"orders": 0, "report": 0}
REPORT = {"seconds": 0.0}
READY = {"total": 0.0, "report": 0.0}
# (start, end) of the latest build_report runs, in order.
REPORT_RUNS = collections.deque(maxlen=4096)


def waited_ready(since):
    """Counts the stretch from `since` to now as ready, waiting for the loop."""
    now = time.perf_counter()
    if now <= since:
        return
    READY["total"] += now - since
    for start, end in reversed(REPORT_RUNS):
        if end <= since:
            break
        READY["report"] += max(0.0, min(now, end) - max(since, start))


def work(seconds):
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += sum(range(100))
    return n


async def fetch_orders_from_db():
    # perf_counter and the loop's time are both CLOCK_MONOTONIC.
    due = time.perf_counter() + 0.02
    await asyncio.sleep(0.02)
    waited_ready(due)
    return [{"id": i, "sku": f"sku-{i}", "qty": i % 7} for i in range(50)]


def call_pricing_service(rows):
    time.sleep(0.01)
    return {r["sku"]: 1.5 for r in rows}, time.perf_counter()


def serialise(rows, prices):
    work(0.002)
    return json.dumps([{**r, "price": prices[r["sku"]]} for r in rows])


async def orders(request):
    start = time.perf_counter()
    rows = await fetch_orders_from_db()
    fetched = time.perf_counter()
    prices, returned = await asyncio.to_thread(call_pricing_service, rows)
    waited_ready(returned)
    priced = time.perf_counter()
    body = serialise(rows, prices)
    end = time.perf_counter()
    SPENT["db"] += fetched - start
    SPENT["pool"] += priced - fetched
    SPENT["serialise"] += end - priced
    SPENT["total"] += end - start
    COUNT["orders"] += 1
    return PlainTextResponse(body)


def build_report():
    return work(0.02)


async def report(request):
    # CPU time, as the loop's: time the thread was preempted is neither's.
    start = time.thread_time()
    began = time.perf_counter()
    build_report()
    REPORT_RUNS.append((began, time.perf_counter()))
    REPORT["seconds"] += time.thread_time() - start
    COUNT["report"] += 1
    return PlainTextResponse("report\n")


async def stats(request):
    # The loop's thread's CPU time (this handler runs on it): the time the loop was busy.
    loop = time.thread_time()
    return JSONResponse(
        {
            "pid": os.getpid(),
            "orders": SPENT,
            "count": COUNT,
            "report": REPORT,
            "loop_cpu": loop,
            "ready": READY,
        }
    )


app = Starlette(
    routes=[
        Route("/orders", orders),
        Route("/report", report),
        Route("/stats", stats),
    ]
)
