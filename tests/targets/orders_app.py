"""A Starlette service for the request-shaped asyncio views (`record --async --async-mode all`),
served by uvicorn with workers, each timing its own requests per phase.

Endpoints:
- /orders: `fetch_orders_from_db` (awaits a database stand-in: asyncio.sleep), `asyncio.to_thread`
  of a blocking client (`call_pricing_service`: time.sleep), then `serialise` (Python work on
  the event loop);
- /report: `build_report`, Python work on the event loop that every other request waits for;
- /stats: this worker's pid, the seconds its /orders requests spent so far, in all and per
  phase, its /report requests' CPU seconds in `build_report`, and its event loop's thread's
  CPU seconds ({"pid": ..., "orders": {"total": s, "db": s, "pool": s, "serialise": s},
  "count": {...}, "report": {"seconds": s}, "loop_cpu": s}).
"""

import asyncio
import json
import os
import time

from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

SPENT = {"total": 0.0, "db": 0.0, "pool": 0.0, "serialise": 0.0}
COUNT = {"orders": 0, "report": 0}
REPORT = {"seconds": 0.0}


def work(seconds):
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += sum(range(100))
    return n


async def fetch_orders_from_db():
    await asyncio.sleep(0.02)
    return [{"id": i, "sku": f"sku-{i}", "qty": i % 7} for i in range(50)]


def call_pricing_service(rows):
    time.sleep(0.01)
    return {r["sku"]: 1.5 for r in rows}


def serialise(rows, prices):
    work(0.002)
    return json.dumps([{**r, "price": prices[r["sku"]]} for r in rows])


async def orders(request):
    start = time.perf_counter()
    rows = await fetch_orders_from_db()
    fetched = time.perf_counter()
    prices = await asyncio.to_thread(call_pricing_service, rows)
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
    build_report()
    REPORT["seconds"] += time.thread_time() - start
    COUNT["report"] += 1
    return PlainTextResponse("report\n")


async def stats(request):
    # The loop's thread's CPU time (this handler runs on it): the time the loop was busy.
    loop = time.thread_time()
    return JSONResponse(
        {"pid": os.getpid(), "orders": SPENT, "count": COUNT, "report": REPORT, "loop_cpu": loop}
    )


app = Starlette(
    routes=[
        Route("/orders", orders),
        Route("/report", report),
        Route("/stats", stats),
    ]
)
