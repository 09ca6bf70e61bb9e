"""How much a pyfleet command slows the process it reads.

Starts a busy target (a loop of short calls that reports its rounds every second) on CPU 0,
lets it run alone, then runs the given pyfleet command against it on CPU 1, then alone
again, and prints the target's speed during the command against its speed alone.

    python3 examples/bench/target_slowdown.py PYTHON SECONDS -- pyfleet bench {pid} --yes
    python3 examples/bench/target_slowdown.py PYTHON SECONDS -- pyfleet record {pid} -o x.folded

`{pid}` in the command is replaced by the target's pid; the command should run about
SECONDS (pass --duration). Needs `taskset` (util-linux).
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

TARGET = """
import sys, time
def step(n):
    return n + 1
def round_():
    x = 0
    for _ in range(1000):
        x = step(x)
    return x
out = open(sys.argv[1], "a", buffering=1)
while True:
    start, rounds = time.perf_counter(), 0
    while time.perf_counter() - start < 1.0:
        round_()
        rounds += 1
    out.write(f"{time.time():.3f} {rounds}\\n")
"""


def main():
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        sys.exit(__doc__)
    python, seconds, command = sys.argv[1], float(sys.argv[2]), sys.argv[4:]
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "target.py")
        report = os.path.join(tmp, "rounds.txt")
        with open(script, "w") as f:
            f.write(TARGET)
        target = subprocess.Popen(["taskset", "-c", "0", python, script, report])
        try:
            time.sleep(seconds + 1.5)
            begin = time.time()
            cmd = [a.replace("{pid}", str(target.pid)) for a in command]
            subprocess.run(["taskset", "-c", "1", *cmd], check=True, stdout=subprocess.DEVNULL)
            end = time.time()
            time.sleep(seconds + 0.5)
        finally:
            target.kill()
            target.wait()
        with open(report) as f:
            rows = [tuple(map(float, line.split())) for line in f][1:]
    # A one-second report counts for the command only if its whole second lies within it.
    during = [n for t, n in rows if begin + 1 <= t <= end]
    alone = [n for t, n in rows if t <= begin or t > end + 1]
    if not during or not alone:
        sys.exit("too few reports: run longer")
    ratio = statistics.mean(during) / statistics.mean(alone)
    print(
        f"rounds a second: alone {statistics.mean(alone):.0f} ({len(alone)} s), "
        f"during the command {statistics.mean(during):.0f} ({len(during)} s): {ratio:.3f}"
    )


if __name__ == "__main__":
    main()
