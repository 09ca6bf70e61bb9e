"""Workload for examples/bench/exactness.py: SymPy (pure Python, with mpmath) doing symbolic math
in the main thread, forever.

usage: real_sympy.py [SEED]

Each round builds new expressions from a seeded generator (so SymPy's caches see fresh
arguments) and runs expand, factor, simplify, trigsimp, series, diff, solve and numeric
evaluation on them: deep stacks of many short calls. One busy thread, no other Python thread.
Prints "ready" (flushed) after two warm-up rounds. Exits when its parent dies or its stdin
reaches end of file (checked from a SIGALRM handler 4 times a second, so that no second Python
thread shows up in a profile), and after LIFETIME seconds regardless. Deterministic for a seed.
"""

import random
import sys

sys.dont_write_bytecode = True

import lifeline  # noqa: E402

LIFETIME = 3600




import sympy  # noqa: E402
from sympy import (  # noqa: E402
    Rational,
    cos,
    diff,
    exp,
    expand,
    factor,
    log,
    series,
    simplify,
    sin,
    solve,
    symbols,
    trigsimp,
)

x, y, z = symbols("x y z")


def coefficient(rng):
    n = rng.randint(-9, 9) or 1
    return Rational(n, rng.randint(1, 4))


def polynomial(rng, var, degree):
    return sum(coefficient(rng) * var**k for k in range(degree + 1))


def algebra(rng):
    p = polynomial(rng, x, rng.randint(2, 3)) * (y + coefficient(rng)) ** rng.randint(2, 4)
    q = expand(p * (x - coefficient(rng)) * (z + 1))
    f = factor(q)
    return len(f.args) + len(q.args)


def trig(rng):
    a, b = coefficient(rng), coefficient(rng)
    e = (sin(a * x) ** 2 + cos(a * x) ** 2) * (b + sin(x) * cos(y)) + sin(x + y) - sin(x) * cos(y)
    s = trigsimp(e)
    t = simplify((x**2 - a**2) / (x - a) + b * exp(log(y)))
    return len(str(s)) + len(str(t))


def calculus(rng):
    a = coefficient(rng)
    f = exp(a * x) * sin(x) / (1 + x)
    s = series(f, x, 0, rng.randint(5, 8)).removeO()
    d = diff(f * log(1 + x**2), x, 2)
    return len(s.args) + len(d.args)


def equations(rng):
    p = expand((x - coefficient(rng)) * (x - coefficient(rng)) * (x + coefficient(rng)))
    roots = solve(p, x)
    value = (sympy.sqrt(2 + abs(coefficient(rng))) * sympy.pi).evalf(rng.randint(30, 60))
    return len(roots) + int(value)


STEPS = [algebra, trig, calculus, equations]


def round_(rng):
    total = 0
    for step in STEPS:
        total += step(rng)
    return total


def main():
    lifeline.start(LIFETIME)
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    rng = random.Random(seed)
    for _ in range(2):
        round_(rng)
    print("ready", flush=True)
    while True:
        round_(rng)


if __name__ == "__main__":
    main()
