#!/usr/bin/env python3
"""3.14+: compare the values _Py_DebugOffsets_INIT stores (dbgval.* lines of
debug_offsets.c) with offsets.c's own offsetof()/sizeof() for the same
members.  Used by derive.sh; prints mismatches to stdout, exit 1 if any.

    check_dbgval.py OFFSETS-OUTPUT DEBUG-OFFSETS-OUTPUT
"""
import sys

from read_runtime import CROSS, add_synthetic, parse_derived


def main():
    derived = add_synthetic(parse_derived(sys.argv[1]))
    dbg = parse_derived(sys.argv[2])
    bad = 0
    compared = 0
    for key, val in dbg.items():
        if not key.startswith("dbgval."):
            continue
        field = key[len("dbgval."):]
        refs = CROSS.get(field, ())
        if isinstance(refs, str):
            refs = (refs,)
        refs = [r for r in refs if r in derived]
        if not refs:
            continue
        compared += 1
        if not any(int(derived[r], 0) == int(val, 0) for r in refs):
            bad += 1
            print("MISMATCH %s = %s but %s" % (key, val, ", ".join(
                "%s = %s" % (r, derived[r]) for r in refs)))
    print("check_dbgval: %d fields compared, %d mismatches" % (compared, bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
