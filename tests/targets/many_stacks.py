"""A Python process whose samples are many different stacks (tests/it/trust.rs): a window of
it is large to render.

usage: many_stacks.py [FUNCTIONS [DEPTH]]

Makes FUNCTIONS (default 2,000) functions, each with a name of its own, and calls chains of
DEPTH (default 24) of them, drawn at random, over and over, spinning at the bottom of each.
Writes `ready` to the file `ready` once the functions are made.
"""

import os
import random
import sys

functions = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
depth = int(sys.argv[2]) if len(sys.argv) > 2 else 24

source = "\n".join(
    f"def function_{i:05d}_of_many_stacks(chain):\n"
    f"    if chain:\n"
    f"        return chain[0](chain[1:])\n"
    f"    return sum(range(300))\n"
    for i in range(functions)
)
namespace = {}
exec(compile(source, "many_stacks_generated.py", "exec"), namespace)
made = [namespace[f"function_{i:05d}_of_many_stacks"] for i in range(functions)]

with open("ready.tmp", "w") as f:
    f.write("ready")
os.replace("ready.tmp", "ready")

rng = random.Random(7)
while True:
    chain = rng.sample(made, depth)
    chain[0](chain[1:])
