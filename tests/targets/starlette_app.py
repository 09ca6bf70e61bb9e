"""A Starlette app for the asyncio task-stack test, served by uvicorn in one process.

Endpoints (each handler times its own body, the server's own view of where requests spend
their time):
- /cpu: Python work on the event loop (`burn_cpu`, about 10 ms);
- /sleep: awaits asyncio.sleep(0.03);
- /pool: awaits a thread-pool call (run_in_threadpool of a 15 ms time.sleep);
- /stats: {"cpu": seconds, "sleep": seconds, "pool": seconds, "count": {...}}: the handlers'
  time so far, and /stats?reset=1 starts the count again.
"""

import asyncio
import time

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

SPENT = {"cpu": 0.0, "sleep": 0.0, "pool": 0.0}
COUNT = {"cpu": 0, "sleep": 0, "pool": 0}


def burn_cpu(seconds):
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += sum(range(200))
    return n


def blocking_io():
    time.sleep(0.015)


def spent(kind, start):
    SPENT[kind] += time.perf_counter() - start
    COUNT[kind] += 1


async def cpu_endpoint(request):
    start = time.perf_counter()
    burn_cpu(0.01)
    spent("cpu", start)
    return PlainTextResponse("cpu\n")


async def sleep_endpoint(request):
    start = time.perf_counter()
    await asyncio.sleep(0.03)
    spent("sleep", start)
    return PlainTextResponse("sleep\n")


async def pool_endpoint(request):
    start = time.perf_counter()
    await run_in_threadpool(blocking_io)
    spent("pool", start)
    return PlainTextResponse("pool\n")


async def stats(request):
    body = {**SPENT, "count": dict(COUNT)}
    if request.query_params.get("reset"):
        for k in SPENT:
            SPENT[k] = 0.0
            COUNT[k] = 0
    return JSONResponse(body)


app = Starlette(
    routes=[
        Route("/cpu", cpu_endpoint),
        Route("/sleep", sleep_endpoint),
        Route("/pool", pool_endpoint),
        Route("/stats", stats),
    ]
)
