import sys
def simple(a, b):
    x = a + b
    if x > 3:
        return [i * 2 for i in range(x)]
    return None

def with_try(n):
    total = 0
    for i in range(n):
        try:
            total += 10 // (i - 3)
        except ZeroDivisionError:
            total -= 1
        finally:
            total += 1
    return total

async def coro(x):
    await x
    return (lambda y:
            y + 1)(2)

src = "def far():\n" + "\n" * 300 + "    return 1\n" + "\n" * 5000 + "    z = 2\n    return z\n"
ns = {}
exec(compile(src, "far.py", "exec"), ns)
for name, f in [("simple", simple), ("with_try", with_try), ("coro", coro), ("far", ns["far"])]:
    c = f.__code__
    print(f"    // python {sys.version.split()[0]}: {name}")
    print("    Vector {")
    print(f"        table: &{list(c.co_linetable)},".replace("[", "[").replace("]", "]"))
    print(f"        first: {c.co_firstlineno},")
    lines = [(s, e, ('None' if l is None else f'Some({l})')) for s, e, l in c.co_lines()]
    print("        lines: &[" + ", ".join(f"({s}, {e}, {l})" for s, e, l in lines) + "],")
    print("    },")
