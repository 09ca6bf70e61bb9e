"""A small WSGI app for the gunicorn tests: every request does recognisable Python work
(`handle_request` -> `render_page` -> `fib_work`, about 10 times as much for `/expensive`)
so snapshots can be checked for the handler's functions; `/sleep` waits 50 ms in `sleep_page` instead (on no CPU): in wall mode it
looks expensive, in cpu mode it does not."""

import time


def fib_work(n):
    return n if n < 2 else fib_work(n - 1) + fib_work(n - 2)


def render_page(path):
    total = fib_work(22 if path == "/expensive" else 18)
    return f"path={path} total={total}\n".encode()


def sleep_page(path):
    time.sleep(0.05)
    return f"path={path} slept\n".encode()


def handle_request(environ, start_response):
    path = environ.get("PATH_INFO", "/")
    body = sleep_page(path) if path == "/sleep" else render_page(path)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


app = handle_request
