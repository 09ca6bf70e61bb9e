"""Calls shorter than a non-blocking read: a loop of about 1.7 µs per iteration (3.11-3.13 on
the development machine), half of it in `inner` (a 100,000-character string copied in C),
half in `plain` (a 50-step loop), `caller` only passing through.

usage: short_calls.py [CHARS]

Stop-the-world sampling (`record --blocking`) sees `inner` and `plain` at about 50% and 45%
of samples as the leaf, `caller` at 1-2%. `inner` on top of `plain`, which never calls it, is
a stack that never existed. README, "Exactness on real code", has what non-blocking reads see.
Prints "ready" (flushed), then loops until its parent dies or stdin reaches end of file
(tests/targets/lifeline.py).
"""

import sys

import lifeline


def inner(text):
    return text + "y"


def caller(text):
    return inner(text)


def plain():
    x = 0
    for i in range(50):
        x += i
    return x


def main():
    lifeline.start(3600)
    text = "x" * (int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
    print("ready", flush=True)
    while True:
        caller(text)
        plain()


if __name__ == "__main__":
    main()
