"""Helper module for stacks.py whose file name is a Latin-1 (1-byte kind) string."""


def ñandú(then):
    return then()
