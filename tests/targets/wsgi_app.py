"""A small WSGI app for the fleet daemon's end-to-end test: every request does recognisable
Python work (`handle_request` -> `render_page` -> `fib_work`) so snapshots can be checked
for the handler's functions."""


def fib_work(n):
    return n if n < 2 else fib_work(n - 1) + fib_work(n - 2)


def render_page(path):
    total = fib_work(18)
    return f"path={path} total={total}\n".encode()


def handle_request(environ, start_response):
    body = render_page(environ.get("PATH_INFO", "/"))
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


app = handle_request
