"""Workload for examples/bench/exactness.py: pyparsing (pure Python) parsing generated documents
in the main thread, forever.

usage: real_parser.py [SEED]

A JSON-like configuration language (objects, arrays, strings, numbers, booleans, null, comments,
and arithmetic expressions with variables and function calls as values, through
infix_notation) is parsed with pyparsing's recursive-descent combinators, then the parse
results are walked and the expressions evaluated. Documents come from a seeded generator, so
every parse sees new input; packrat memoisation is off (pyparsing's default), which makes the
stacks deep and the calls many and short. One busy thread, no other Python thread.

Prints "ready" (flushed) after a warm-up. Exits when its parent dies or its stdin reaches end
of file (checked from a SIGALRM handler 4 times a second, so that no second Python thread shows
up in a profile), and after LIFETIME seconds regardless. Deterministic for a seed.
"""

import math
import operator
import random
import sys

sys.dont_write_bytecode = True

import lifeline  # noqa: E402

LIFETIME = 3600




import pyparsing as pp  # noqa: E402

# --- the grammar --------------------------------------------------------------------------------


class Expr:
    """An arithmetic expression node built by the parse actions."""

    def __init__(self, op, args):
        self.op = op
        self.args = args


def make_binary(tokens):
    items = tokens[0]
    node = items[0]
    for i in range(1, len(items), 2):
        node = Expr(items[i], [node, items[i + 1]])
    return node


def make_unary(tokens):
    return Expr("neg", [tokens[0][1]])


def make_call(tokens):
    return Expr("call:" + tokens[0], list(tokens[1:]))


def make_var(tokens):
    return Expr("var", [tokens[0]])


def make_member(tokens):
    return [(tokens[0], tokens[1])]


def make_object(tokens):
    return [dict(tokens.as_list())]


def make_array(tokens):
    return [tokens.as_list()]


def grammar():
    LBRACE, RBRACE, LBRACK, RBRACK, COLON, COMMA, LPAR, RPAR = map(pp.Suppress, "{}[]:,()")
    string = pp.QuotedString('"', esc_char="\\")
    number = pp.common.number
    keyword = (
        pp.Keyword("true").set_parse_action(lambda: True)
        | pp.Keyword("false").set_parse_action(lambda: False)
        | pp.Keyword("null").set_parse_action(lambda: None)
    )
    ident = pp.Word(pp.alphas + "_", pp.alphanums + "_")

    expr = pp.Forward()
    call = (ident + LPAR + pp.Opt(pp.DelimitedList(expr)) + RPAR).set_parse_action(make_call)
    variable = pp.Combine("$" + ident).set_parse_action(lambda t: Expr("var", [t[0][1:]]))
    operand = call | variable | number
    expr <<= pp.infix_notation(
        operand,
        [
            (pp.one_of("-"), 1, pp.OpAssoc.RIGHT, make_unary),
            (pp.one_of("* / %"), 2, pp.OpAssoc.LEFT, make_binary),
            (pp.one_of("+ -"), 2, pp.OpAssoc.LEFT, make_binary),
        ],
    )
    computed = pp.Suppress("=") + expr

    value = pp.Forward()
    member = (string + COLON + value).set_parse_action(make_member)
    obj = (LBRACE + pp.Opt(pp.DelimitedList(member, allow_trailing_delim=True)) + RBRACE).set_parse_action(
        make_object
    )
    array = (LBRACK + pp.Opt(pp.DelimitedList(value, allow_trailing_delim=True)) + RBRACK).set_parse_action(
        make_array
    )
    value <<= string | keyword | computed | number | obj | array
    document = value + pp.StringEnd()
    document.ignore(pp.cpp_style_comment)
    return document


# --- evaluation -----------------------------------------------------------------------------------

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "%": math.fmod}
FUNCS = {
    "min": lambda *a: min(a),
    "max": lambda *a: max(a),
    "abs": lambda *a: abs(a[0]),
    "sqrt": lambda *a: math.sqrt(abs(sum(a))),
    "sum": lambda *a: sum(a),
}


def evaluate(node, env):
    if not isinstance(node, Expr):
        return node
    if node.op == "var":
        return env.get(node.args[0], 1.0)
    if node.op == "neg":
        return -evaluate(node.args[0], env)
    if node.op.startswith("call:"):
        args = [evaluate(a, env) for a in node.args]
        return FUNCS[node.op[5:]](*args) if args else 0.0
    left, right = evaluate(node.args[0], env), evaluate(node.args[1], env)
    if node.op in "/%" and right == 0:
        return 0.0
    return OPS[node.op](left, right)


def walk(value, env):
    if isinstance(value, dict):
        return sum(walk(v, env) for v in value.values()) + len(value)
    if isinstance(value, list):
        return sum(walk(v, env) for v in value)
    if isinstance(value, Expr):
        v = evaluate(value, env)
        return 0 if v != v else int(v) % 1000
    return 1


# --- generated documents ----------------------------------------------------------------------------

NAMES = ["host", "port", "weight", "rate", "limits", "tags", "retries", "timeout", "ratio", "owner"]
VARS = ["a", "b", "cpu", "mem", "n_workers"]


def gen_expr(rng, depth):
    r = rng.random()
    if depth <= 0 or r < 0.3:
        return rng.choice([str(rng.randint(0, 999)), "%.2f" % rng.uniform(0, 100), "$" + rng.choice(VARS)])
    if r < 0.4:
        args = ", ".join(gen_expr(rng, depth - 1) for _ in range(rng.randint(1, 3)))
        return "%s(%s)" % (rng.choice(sorted(FUNCS)), args)
    if r < 0.5:
        return "-" + gen_expr(rng, depth - 1)
    if r < 0.6:
        return "(%s)" % gen_expr(rng, depth - 1)
    return "%s %s %s" % (gen_expr(rng, depth - 1), rng.choice("+-*/%"), gen_expr(rng, depth - 1))


def gen_value(rng, depth):
    r = rng.random()
    if depth <= 0 or r < 0.35:
        return rng.choice(
            [
                '"%s"' % rng.choice(NAMES),
                '"esc \\"%d\\""' % rng.randint(0, 99),
                str(rng.randint(-500, 500)),
                "%.3e" % rng.uniform(-1e6, 1e6),
                "true",
                "false",
                "null",
            ]
        )
    if r < 0.55:
        return "= " + gen_expr(rng, 3)
    if r < 0.8:
        members = []
        for _ in range(rng.randint(1, 5)):
            comment = "  // %s\n" % rng.choice(NAMES) if rng.random() < 0.2 else ""
            members.append('%s"%s": %s' % (comment, rng.choice(NAMES), gen_value(rng, depth - 1)))
        return "{" + ", ".join(members) + "}"
    return "[" + ", ".join(gen_value(rng, depth - 1) for _ in range(rng.randint(1, 4))) + "]"


class Parser:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.document = grammar()

    def one_round(self):
        text = "{" + ", ".join('"k%d": %s' % (i, gen_value(self.rng, 4)) for i in range(6)) + "}"
        parsed = self.document.parse_string(text, parse_all=True)[0]
        env = {v: self.rng.uniform(1, 10) for v in VARS}
        return walk(parsed, env)


def main():
    lifeline.start(LIFETIME)
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    p = Parser(seed)
    for _ in range(20):
        p.one_round()
    print("ready", flush=True)
    while True:
        p.one_round()


if __name__ == "__main__":
    main()
