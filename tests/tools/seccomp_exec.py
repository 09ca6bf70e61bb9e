"""Runs a program under a seccomp profile, as a container runtime applies a Kubernetes
`Localhost` profile (the OCI JSON format: defaultAction, defaultErrnoRet, syscalls with names,
action, errnoRet and args), with libseccomp (libseccomp.so.2, which systemd depends on).

usage: seccomp_exec.py PROFILE.json PROGRAM [ARGS...]

Like runc: names this architecture does not have are skipped, a rule whose action is the
default one is left out, the conditions of one rule must all hold (several rules for one call:
any of them), and no_new_privs is set (libseccomp's default; a pod with
allowPrivilegeEscalation: false and a unit with NoNewPrivileges=yes have it too). Then it
execs PROGRAM: everything PROGRAM does is filtered. Only the native architecture is filtered
(a unit's SystemCallArchitectures=native).
"""

import ctypes
import errno
import json
import os
import sys

ACT_ALLOW = 0x7FFF0000
ACT_ERRNO = 0x00050000
ACT_KILL_PROCESS = 0x80000000
OPS = {
    "SCMP_CMP_NE": 1,
    "SCMP_CMP_LT": 2,
    "SCMP_CMP_LE": 3,
    "SCMP_CMP_EQ": 4,
    "SCMP_CMP_GE": 5,
    "SCMP_CMP_GT": 6,
    "SCMP_CMP_MASKED_EQ": 7,
}


class ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def action(name, errno_ret):
    if name == "SCMP_ACT_ALLOW":
        return ACT_ALLOW
    if name == "SCMP_ACT_ERRNO":
        return ACT_ERRNO | ((errno.EPERM if errno_ret is None else errno_ret) & 0xFFFF)
    if name in ("SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL"):
        return ACT_KILL_PROCESS
    sys.exit(f"seccomp_exec: action {name} is not supported")


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: seccomp_exec.py PROFILE.json PROGRAM [ARGS...]")
    with open(sys.argv[1]) as f:
        profile = json.load(f)
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]

    default = action(profile["defaultAction"], profile.get("defaultErrnoRet"))
    ctx = lib.seccomp_init(default)
    if not ctx:
        sys.exit("seccomp_exec: seccomp_init failed")
    for rule in profile.get("syscalls", []):
        act = action(rule["action"], rule.get("errnoRet"))
        if act == default:
            continue
        args = rule.get("args") or []
        cmps = (ArgCmp * max(len(args), 1))()
        for i, a in enumerate(args):
            cmps[i] = ArgCmp(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0))
        for name in rule["names"]:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                continue  # not a call of this architecture
            rc = lib.seccomp_rule_add_array(ctx, act, nr, len(args), cmps)
            if rc != 0:
                sys.exit(f"seccomp_exec: rule for {name}: {os.strerror(-rc)}")
    rc = lib.seccomp_load(ctx)
    if rc != 0:
        sys.exit(f"seccomp_exec: seccomp_load: {os.strerror(-rc)}")
    os.execv(sys.argv[2], sys.argv[2:])


main()
