"""Helper module for stacks.py whose file name is an astral (4-byte kind) string."""


def 𠀂𠀃(then):
    return then()
