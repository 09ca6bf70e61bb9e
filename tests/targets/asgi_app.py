"""A small ASGI app for the uvicorn test: every request answers "ok" after a little Python
work (`handle_request` -> `fib_work`)."""


def fib_work(n):
    return n if n < 2 else fib_work(n - 1) + fib_work(n - 2)


async def handle_request(send):
    body = f"ok {fib_work(15)}\n".encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    if scope["type"] == "http":
        await handle_request(send)
