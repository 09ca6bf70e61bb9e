"""How exact is pyfleet's non-blocking sampling on real pure-Python libraries? Side by side with
a stop-the-world reference (py-spy in its default blocking mode, which pauses the target for
every sample), over the same seconds, on CPython 3.11 to 3.15.

Set up first (venvs with SymPy, Jinja2, pyparsing on every version, and py-spy), as root, after
`cargo build --release`:

    scripts/setup-libs.sh
    python3 examples/bench/exactness.py [--versions 3.11,3.15] [--workloads sympy,jinja,parser]
                                        [--duration 10] [--rate 100] [--alone] [--keep DIR]

For each version and workload it starts tests/targets/real_<workload>.py in that version's venv
($PYFLEET_VENVS/libs-3.X, default ~/.cache/pyfleet/venvs), waits for its "ready", then runs at
the same time, over the same seconds:

    pyfleet record --pid PID --duration S --rate R -o pyfleet.folded        (non-blocking)
    py-spy record --pid PID --duration S --rate R --format raw -o py-spy.txt (blocking)

Both outputs are folded stacks (pyfleet: `<process>-<pid>;root;...;leaf N`; py-spy raw:
`root;...;leaf N`; frames `function (file:line)`, the function being the code object's
qualified name in both). Frames are reduced to (function, file) without line numbers; files to
the part py-spy shows (after `site-packages/`, after `lib/python3.X/`, else the base name of a
script); CPython's `__init__` shim frame (3.13+), which py-spy shows and pyfleet does not, is
dropped. For each function: self share (% of samples where it is the leaf) and total share (%
of samples where it is anywhere on the stack, once per sample). The table gives, per version
and workload: samples written and failed by pyfleet (its last stderr line), py-spy's samples,
the function with the largest |self share difference| and the one with the largest |total share
difference| (both values, the difference in points, and sigma: the binomial standard error
sqrt(p(1-p)/n) of one share at that p and n = the smaller sample count, in points; the
difference of two independent estimates has sqrt(2) sigma), and half the sum of |self share
differences| over all functions (total variation distance: 0 = the same profile). "Chance
p95" is what chance alone gives: the 95th percentile, over --null-rounds resamplings, of the
same figure between two independent samples of the two sizes drawn from the pooled leaf
distribution (the largest of many differences is larger than one sigma). Consecutive samples
of one process are correlated, so the real noise floor is somewhat above both.

pyfleet's "wrote N thread samples" counts samples whose stack had no Python frame, which the
folded file leaves out: the table shows both when they differ. Shares are over the file.

Control: `--sequential --pyfleet-arg=--blocking` runs pyfleet's own blocking mode, then
py-spy, on the same target (two ptrace users of one process at once would collide).

Caveat: py-spy stops the target for each of its samples; a pyfleet sample that lands in such a
stop reads a still stack. `--alone` also runs pyfleet by itself for the same duration right
after, and reports its failure share there.

A version whose venv is missing is skipped with a note (set PYFLEET_ALLOW_MISSING=0 to fail
instead). If py-spy cannot read a version, the reference is left out for it and said so.
"""
import argparse
import collections
import json
import math
import os
import pathlib
import random
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TARGETS = ROOT / "tests" / "targets"
VERSIONS = ["3.11", "3.12", "3.13", "3.14", "3.15"]
WORKLOADS = {
    "sympy": "real_sympy.py",
    "jinja": "real_jinja.py",
    "parser": "real_parser.py",
}
READY_TIMEOUT = 180.0


def venvs_dir():
    return pathlib.Path(os.environ.get("PYFLEET_VENVS", pathlib.Path.home() / ".cache/pyfleet/venvs"))


# --- parsing folded stacks ------------------------------------------------------------------------

FRAME_WITH_LINE = re.compile(r"^(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")
FRAME_NO_LINE = re.compile(r"^(?P<func>.*) \((?P<file>.*)\)$")
STDLIB = re.compile(r"/lib/python3\.\d+t?/(?P<rest>.*)$")
# CPython's own shim frames, which py-spy shows and pyfleet (like tracebacks) leaves out: the
# `__init__` cleanup frame (code object `__init__` in file `__init__`) that 3.13+ pushes under a
# specialised call of a class whose __init__ is Python.
SHIMS = {("__init__", "__init__")}


def short_file(path):
    """The file as py-spy shows it (idempotent on py-spy's own short names)."""
    if path.startswith("<"):
        return path
    i = path.rfind("site-packages/")
    if i >= 0:
        return path[i + len("site-packages/"):]
    m = STDLIB.search(path)
    if m:
        return m.group("rest")
    if path.startswith("/"):
        return os.path.basename(path)
    return path


def parse_frame(text):
    m = FRAME_WITH_LINE.match(text) or FRAME_NO_LINE.match(text)
    if not m:
        return (text, "")
    return (m.group("func"), short_file(m.group("file")))


def read_folded(path, strip_process=None):
    """[(frames root first as (function, file), count)]. strip_process: the pid whose
    `<process>-<pid>` first element pyfleet puts on every stack."""
    stacks = []
    suffix = None if strip_process is None else "-%d" % strip_process
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            stack, _, count = line.rpartition(" ")
            try:
                n = int(count)
            except ValueError:
                raise SystemExit("%s: bad line %r" % (path, line[:200]))
            parts = stack.split(";")
            if suffix is not None and parts and parts[0].endswith(suffix) and " (" not in parts[0]:
                parts = parts[1:]
            if not parts:
                continue
            frames = [fr for fr in map(parse_frame, parts) if fr not in SHIMS]
            if frames:
                stacks.append((frames, n))
    return stacks


def shares(stacks):
    """(n, self %, total %) per (function, file)."""
    n = sum(c for _, c in stacks)
    self_ = collections.Counter()
    total = collections.Counter()
    for frames, c in stacks:
        self_[frames[-1]] += c
        for fr in set(frames):
            total[fr] += c
    if n == 0:
        return 0, {}, {}
    return n, {k: 100.0 * v / n for k, v in self_.items()}, {k: 100.0 * v / n for k, v in total.items()}


def largest_diff(a, b):
    """(function, a %, b %) of the largest |a - b| over the union of keys."""
    best = None
    for k in set(a) | set(b):
        d = abs(a.get(k, 0.0) - b.get(k, 0.0))
        if best is None or d > best[0] or (d == best[0] and k < best[1]):
            best = (d, k)
    if best is None:
        return None
    k = best[1]
    return k, a.get(k, 0.0), b.get(k, 0.0)


def null_noise(pf_stacks, spy_stacks, rounds, seed=0):
    """95th percentiles of the largest |self share difference| and of the total variation
    distance between two independent samples of the two sizes drawn from the pooled leaf
    distribution: what chance alone gives when both profilers see the same process."""
    pooled = collections.Counter()
    for frames, c in pf_stacks + spy_stacks:
        pooled[frames[-1]] += c
    n1 = sum(c for _, c in pf_stacks)
    n2 = sum(c for _, c in spy_stacks)
    if not n1 or not n2 or rounds <= 0:
        return float("nan"), float("nan")
    keys = list(pooled)
    weights = [pooled[k] for k in keys]
    rng = random.Random(seed)
    maxes, tvds = [], []
    idx = range(len(keys))
    for _ in range(rounds):
        a = collections.Counter(rng.choices(idx, weights, k=n1))
        b = collections.Counter(rng.choices(idx, weights, k=n2))
        diffs = [abs(100.0 * a[i] / n1 - 100.0 * b[i] / n2) for i in set(a) | set(b)]
        maxes.append(max(diffs))
        tvds.append(sum(diffs) / 2)
    maxes.sort()
    tvds.sort()
    q = int(0.95 * (rounds - 1))
    return maxes[q], tvds[q]


def sigma(p_percent, n):
    if n <= 0:
        return float("nan")
    p = p_percent / 100.0
    return 100.0 * math.sqrt(p * (1 - p) / n)


# --- running --------------------------------------------------------------------------------------

PYFLEET_WROTE = re.compile(r"wrote (\d+) thread samples?")
PYFLEET_FAILED = re.compile(r"(\d+) failed samples?")
PY_SPY_SAMPLES = re.compile(r"Samples: (\d+) Errors: (\d+)")
PY_SPY_BEHIND = re.compile(r"([\d.]+)s behind in sampling")


def start_target(python, script, seed, log):
    p = subprocess.Popen(
        [str(python), str(script), str(seed)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        cwd=str(TARGETS),
    )
    deadline = time.monotonic() + READY_TIMEOUT
    line = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 1.0)
        if r:
            line = p.stdout.readline()
            break
        if p.poll() is not None:
            break
    if b"ready" not in line:
        stop_target(p)
        raise RuntimeError("%s did not print ready under %s (see %s)" % (script.name, python, log.name))
    time.sleep(0.5)
    return p


def stop_target(p):
    try:
        p.stdin.close()
    except OSError:
        pass
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def pyfleet_cmd(args, pid, out):
    return [args.pyfleet, "record", "--pid", str(pid), "--duration", str(args.duration), "--rate", str(args.rate),
            "-o", str(out)] + args.pyfleet_arg


def run_all(commands, timeout, sequential):
    """{name: (returncode, stdout, stderr)}: every command at once, or one after the other."""
    outs = {}
    procs = {}
    for name, cmd in commands.items():
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if sequential:
            outs[name] = finish(procs[name], timeout)
    for name, p in procs.items():
        if name not in outs:
            outs[name] = finish(p, timeout)
    return outs


def finish(p, timeout):
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        o, e = p.communicate()
    return p.returncode, o, e


ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOG_TIME = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z\s*")


def parse_pyfleet_stderr(text):
    lines = [LOG_TIME.sub("", ANSI.sub("", l)) for l in text.splitlines() if l.strip()]
    wrote = failed = None
    for l in lines:
        m = PYFLEET_WROTE.search(l)
        if m:
            wrote = int(m.group(1))
            m2 = PYFLEET_FAILED.search(l)
            failed = int(m2.group(1)) if m2 else 0
    other = [l for l in lines if not PYFLEET_WROTE.search(l)]
    return wrote, failed, other


def run_pair(args, version, workload, outdir):
    py = venvs_dir() / ("libs-" + version) / "bin" / "python"
    script = TARGETS / WORKLOADS[workload]
    tag = "%s-%s" % (version, workload)
    pf_out = outdir / (tag + ".pyfleet.folded")
    spy_out = outdir / (tag + ".py-spy.txt")
    res = {"version": version, "workload": workload}
    with open(outdir / (tag + ".target.log"), "wb") as log:
        target = start_target(py, script, args.seed, log)
    try:
        res["python"] = subprocess.run(
            [str(py), "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True
        ).stdout.strip()
        commands = {"pyfleet": pyfleet_cmd(args, target.pid, pf_out)}
        if args.py_spy and version not in args.no_py_spy:
            commands["py-spy"] = [args.py_spy, "record", "--pid", str(target.pid), "--duration", str(args.duration),
                                  "--rate", str(args.rate), "--format", "raw", "-o", str(spy_out)]
        outs = run_all(commands, args.duration + 120, args.sequential)
        rc, o, e = outs["pyfleet"]
        (outdir / (tag + ".pyfleet.stderr")).write_text(e)
        wrote, failed, other = parse_pyfleet_stderr(e)
        res["pyfleet_rc"] = rc
        res["pyfleet_stderr_other"] = other
        res["pyfleet_wrote"] = wrote
        res["pyfleet_failed"] = failed
        if rc != 0 or not pf_out.exists():
            res["pyfleet_error"] = (e.strip().splitlines() or ["exit %s" % rc])[-1]
            pf_stacks = []
        else:
            pf_stacks = read_folded(pf_out, strip_process=target.pid)
        res["pyfleet_n"], pf_self, pf_total = shares(pf_stacks)
        if "py-spy" in outs:
            rc, o, e = outs["py-spy"]
            (outdir / (tag + ".py-spy.stderr")).write_text(o + e)
            m = PY_SPY_SAMPLES.search(o + e)
            res["py_spy_reported"] = int(m.group(1)) if m else None
            res["py_spy_errors"] = int(m.group(2)) if m else None
            behind = [float(x) for x in PY_SPY_BEHIND.findall(o + e)]
            if behind:
                # py-spy fell behind (the machine stalled it) and caught up with back-to-back
                # samples of a target it keeps stopping: one stack counted many times.
                res["py_spy_behind"] = max(behind)
            if rc != 0 or not spy_out.exists():
                res["py_spy_error"] = ((o + e).strip().splitlines() or ["exit %s" % rc])[-1]
                spy_stacks = []
            else:
                spy_stacks = read_folded(spy_out)
            res["py_spy_n"], spy_self, spy_total = shares(spy_stacks)
            if res["py_spy_n"] == 0 and "py_spy_error" not in res:
                res["py_spy_error"] = "no samples"
        else:
            res["py_spy_error"] = "not run"
            res["py_spy_n"], spy_self, spy_total = 0, {}, {}
        if res["pyfleet_n"] and res["py_spy_n"]:
            n = min(res["pyfleet_n"], res["py_spy_n"])
            for kind, a, b in (("self", pf_self, spy_self), ("total", pf_total, spy_total)):
                k, va, vb = largest_diff(a, b)
                res[kind] = {
                    "function": k[0], "file": k[1], "pyfleet": va, "py_spy": vb, "diff": va - vb,
                    "sigma": sigma((va + vb) / 2, n),
                }
            keys = set(pf_self) | set(spy_self)
            res["self_tvd"] = sum(abs(pf_self.get(k, 0.0) - spy_self.get(k, 0.0)) for k in keys) / 2
            res["null_max_self"], res["null_tvd"] = null_noise(pf_stacks, spy_stacks, args.null_rounds)
            res["functions"] = len(set(pf_total) | set(spy_total))
            res["max_depth"] = max(len(f) for f, _ in pf_stacks + spy_stacks)
        if args.alone:
            alone_out = outdir / (tag + ".pyfleet-alone.folded")
            p = subprocess.run(
                pyfleet_cmd(args, target.pid, alone_out),
                capture_output=True, text=True, timeout=args.duration + 120,
            )
            (outdir / (tag + ".pyfleet-alone.stderr")).write_text(p.stderr)
            wrote, failed, other = parse_pyfleet_stderr(p.stderr)
            res["alone_wrote"], res["alone_failed"] = wrote, failed
            res["alone_stderr_other"] = other
            if p.returncode != 0:
                res["alone_error"] = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        if target.poll() is not None:
            res["target_died"] = target.returncode
    finally:
        stop_target(target)
    return res


# --- reporting ------------------------------------------------------------------------------------


def pct(part, whole):
    return 100.0 * part / whole if whole else float("nan")


def fn_label(d):
    name = d["function"]
    if len(name) > 48:
        name = "…" + name[-47:]
    return "`%s` (%s)" % (name.replace("|", "\\|"), d["file"].replace("|", "\\|"))


def diff_cell(d, null=None):
    extra = "" if null is None else ", chance p95 %.1f" % null
    return "%s: %.1f%% vs %.1f%%, %+.1f pts (σ %.1f%s)" % (
        fn_label(d), d["pyfleet"], d["py_spy"], d["diff"], d["sigma"], extra)


def table(results, alone):
    head = ["version", "workload", "pyfleet samples", "pyfleet failed"]
    if alone:
        head.append("pyfleet alone: failed")
    head += ["py-spy samples", "largest self diff: function, pyfleet vs py-spy", "largest total diff",
             "Σ\\|self diff\\|/2 (chance p95)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "error" in r:
            cells = [r["version"], r["workload"], "error: " + r["error"]] + [""] * (len(head) - 3)
            rows.append("| " + " | ".join(cells) + " |")
            continue
        ver = r.get("python", r["version"])
        wrote, failed = r.get("pyfleet_wrote"), r.get("pyfleet_failed")
        if "pyfleet_error" in r:
            pf_cell, fail_cell = "error: " + r["pyfleet_error"], ""
        else:
            pf_cell = str(wrote if wrote is not None else r["pyfleet_n"])
            if wrote is not None and wrote != r["pyfleet_n"]:
                pf_cell += " (%d in the file)" % r["pyfleet_n"]
            fail_cell = "%d (%.1f%%)" % (failed, pct(failed, failed + (wrote or 0))) if failed is not None else "?"
        cells = [ver, r["workload"], pf_cell, fail_cell]
        if alone:
            if "alone_error" in r:
                cells.append("error: " + r["alone_error"])
            elif r.get("alone_failed") is not None:
                cells.append("%d of %d (%.1f%%)" % (r["alone_failed"], r["alone_failed"] + r["alone_wrote"],
                                                   pct(r["alone_failed"], r["alone_failed"] + r["alone_wrote"])))
            else:
                cells.append("?")
        if r.get("py_spy_error"):
            cells += ["n/a (py-spy: %s)" % r["py_spy_error"], "", "", ""]
        else:
            spy = str(r["py_spy_n"])
            if r.get("py_spy_errors"):
                spy += " (%d errors)" % r["py_spy_errors"]
            if r.get("py_spy_behind"):
                spy += " ⚠ %.1f s behind" % r["py_spy_behind"]
            if "self" in r:
                cells += [spy, diff_cell(r["self"], r.get("null_max_self")), diff_cell(r["total"]),
                          "%.1f pts (%.1f)" % (r["self_tvd"], r.get("null_tvd", float("nan")))]
            else:
                cells += [spy, "no pyfleet samples to compare", "", ""]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", default=",".join(VERSIONS), help="comma-separated, default all of 3.11-3.15")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    ap.add_argument("--duration", type=int, default=10, help="seconds of each recording (default 10)")
    ap.add_argument("--rate", type=int, default=100, help="samples per second, both profilers (default 100)")
    ap.add_argument("--seed", type=int, default=1, help="the workloads' seed (default 1)")
    ap.add_argument("--pyfleet", default=str(ROOT / "target/release/pyfleet"))
    ap.add_argument("--py-spy", default=str(venvs_dir() / "py-spy/bin/py-spy"),
                    help="py-spy executable ('' for none: pyfleet's failure rate only)")
    ap.add_argument("--no-py-spy", default="", help="comma-separated versions to run without the reference")
    ap.add_argument("--alone", action="store_true", help="also run pyfleet alone afterwards (its failure rate without py-spy's stops)")
    ap.add_argument("--pyfleet-arg", action="append", default=[],
                    help="extra argument for pyfleet record (repeatable), e.g. --pyfleet-arg=--blocking")
    ap.add_argument("--sequential", action="store_true",
                    help="run pyfleet, then py-spy, on the same target (not the same seconds): for "
                         "--pyfleet-arg=--blocking, since two ptrace users of one process collide")
    ap.add_argument("--null-rounds", type=int, default=200,
                    help="resamplings for the chance figures (default 200; 0 for none)")
    ap.add_argument("--keep", help="directory for every output (default: a temporary one, removed)")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    args = ap.parse_args()
    args.no_py_spy = set(filter(None, args.no_py_spy.split(",")))
    versions = [v for v in args.versions.split(",") if v]
    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            ap.error("unknown workload %r (%s)" % (w, ", ".join(WORKLOADS)))
    if not os.access(args.pyfleet, os.X_OK):
        sys.exit("exactness.py: no pyfleet at %s (cargo build --release)" % args.pyfleet)
    if args.py_spy and not os.access(args.py_spy, os.X_OK):
        sys.exit("exactness.py: no py-spy at %s (scripts/setup-libs.sh, or --py-spy '')" % args.py_spy)
    if os.geteuid() != 0:
        print("exactness.py: not root: both profilers need CAP_SYS_PTRACE over the targets", file=sys.stderr)

    def binary_stamp():
        st = os.stat(args.pyfleet)
        return "%s, built %s UTC" % (
            subprocess.run([args.pyfleet, "--version"], capture_output=True, text=True).stdout.strip(),
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(st.st_mtime)))

    stamp_before = binary_stamp()
    outdir = pathlib.Path(args.keep) if args.keep else pathlib.Path(tempfile.mkdtemp(prefix="pyfleet-exactness-"))
    outdir.mkdir(parents=True, exist_ok=True)
    results = []
    notes = []
    try:
        for v in versions:
            py = venvs_dir() / ("libs-" + v) / "bin" / "python"
            if not py.exists():
                msg = "%s: no venv at %s (scripts/setup-libs.sh)" % (v, py.parent.parent)
                if os.environ.get("PYFLEET_ALLOW_MISSING", "1") == "0":
                    sys.exit("exactness.py: " + msg)
                notes.append(msg)
                continue
            for w in workloads:
                print("exactness: %s %s ..." % (v, w), file=sys.stderr, flush=True)
                try:
                    r = run_pair(args, v, w, outdir)
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    r = {"version": v, "workload": w, "error": str(e)}
                results.append(r)
                if "self" in r:
                    print("exactness:   pyfleet %s (+%s failed), py-spy %s; self %+.1f, total %+.1f pts"
                          % (r["pyfleet_wrote"], r["pyfleet_failed"], r["py_spy_n"], r["self"]["diff"],
                             r["total"]["diff"]), file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(outdir, ignore_errors=True)

    print("%d s per recording at %d Hz; pyfleet %s%s and py-spy (blocking) %s"
          % (args.duration, args.rate, " ".join(["record"] + args.pyfleet_arg),
             "" if "--blocking" in args.pyfleet_arg else " (non-blocking)",
             "one after the other on the same target" if args.sequential else "at the same time"))
    stamp_after = binary_stamp()
    print("pyfleet binary: %s%s" % (stamp_before, "" if stamp_after == stamp_before else
                                   " (rebuilt during the run: now %s)" % stamp_after))
    print()
    print(table(results, args.alone))
    print()
    print("Shares in % of each profiler's samples in its file; pts = percentage points; σ = binomial "
          "standard error of one share; chance p95 = 95th percentile of the same figure between two "
          "independent samples of the pooled profile (see the docstring).")
    other = collections.Counter()
    for r in results:
        for l in r.get("pyfleet_stderr_other", []) + r.get("alone_stderr_other", []):
            other[re.sub(r"\d+", "N", l)] += 1
    if other:
        print()
        print("pyfleet's other stderr lines (digits as N), times seen:")
        for l, c in other.most_common():
            print("- %d × %s" % (c, l))
    for r in results:
        if r.get("py_spy_behind"):
            notes.append("%s %s: py-spy fell %.1f s behind and caught up with back-to-back samples of a "
                         "target it kept stopping (one stack counted many times): rerun this pair"
                         % (r["version"], r["workload"], r["py_spy_behind"]))
        attempted = (r.get("pyfleet_wrote") or 0) + (r.get("pyfleet_failed") or 0)
        if "pyfleet_wrote" in r and attempted < 0.95 * args.duration * args.rate:
            notes.append("%s %s: pyfleet attempted %d samples of %d (missed ticks: the machine stalled?)"
                         % (r["version"], r["workload"], attempted, args.duration * args.rate))
        if "target_died" in r:
            notes.append("%s %s: the target exited (%s) during the recording" % (r["version"], r["workload"], r["target_died"]))
    for n in notes:
        print("note: " + n)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
