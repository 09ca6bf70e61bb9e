"""Helper module for stacks.py whose file name is a BMP (2-byte kind) string."""


def 呼び出し(then):
    return then()
