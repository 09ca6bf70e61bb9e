"""Target for the fleet page's test: spins in a function whose code object is named with
markup (`<img src=x onerror=...>`), which must show as text wherever pyfleet shows it. Writes
the file named by its first argument once spinning."""
import sys

MARKUP = "<img src=x onerror=\"document.title='pwned'\">"


def spin(ready):
    with open(ready, "w") as f:
        f.write("ready\n")
    x = 0
    while True:
        x = (x * 31 + 7) % 1000003


spin.__code__ = spin.__code__.replace(co_name=MARKUP, co_qualname=MARKUP)
spin(sys.argv[1])
