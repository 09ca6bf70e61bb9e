"""Workload for examples/bench/exactness.py: Jinja2 (pure Python, with MarkupSafe's pure-Python
escape) rendering HTML pages in the main thread, forever.

usage: real_jinja.py [SEED]

A page template extends a layout (blocks, super()), imports macros, loops over tables with
loop variables, calls filters (escape under autoescape, format, truncate, groupby, sort, sum,
join, default, title, round) and a custom filter and test, over data made afresh by a seeded
generator for every render. Every RECOMPILE renders the environment is made anew, so the
templates are lexed, parsed and compiled again (Jinja's own Python code). One busy thread, no
other Python thread. MarkupSafe's C speedups are blocked before import so that every version
runs the same pure-Python code, whatever wheel pip installed.

Prints "ready" (flushed) after a warm-up. Exits when its parent dies or its stdin reaches end
of file (checked from a SIGALRM handler 4 times a second, so that no second Python thread shows
up in a profile), and after LIFETIME seconds regardless. Deterministic for a seed.
"""

import random
import sys

sys.dont_write_bytecode = True

import lifeline  # noqa: E402

LIFETIME = 3600
RECOMPILE = 40




sys.modules["markupsafe._speedups"] = None  # ImportError: markupsafe falls back to _native
import jinja2  # noqa: E402
import markupsafe  # noqa: E402

if markupsafe._escape_inner.__module__ != "markupsafe._native":
    sys.exit("real_jinja.py: markupsafe's C speedups are in use (%s)" % markupsafe._escape_inner.__module__)

TEMPLATES = {
    "layout.html": """<!doctype html>
<html><head><title>{% block title %}{{ site|title }}{% endblock %}</title></head>
<body>
<nav>{% for item in nav %}<a href="{{ item.href }}"{% if loop.first %} class="first"{% endif %}>{{ item.label|e }}</a>{% if not loop.last %} | {% endif %}{% endfor %}</nav>
<main>{% block content %}{% endblock %}</main>
<footer>{% block footer %}{{ site }} &middot; {{ year }}{% endblock %}</footer>
</body></html>
""",
    "macros.html": """{% macro money(value, currency="EUR") -%}
{{ "%.2f"|format(value) }} {{ currency }}
{%- endmacro %}
{% macro badge(user) -%}
<span class="badge {{ 'admin' if user.admin else 'user' }}" title="{{ user.bio|truncate(40) }}">{{ user.name|e }}</span>
{%- endmacro %}
{% macro row(order, loop) -%}
<tr class="{{ loop.cycle('odd', 'even') }}{% if order.total is big %} big{% endif %}">
<td>{{ loop.index }}</td><td>{{ badge(order.user) }}</td>
<td>{% for line in order.lines %}{{ line.sku }}&times;{{ line.qty }}{% if not loop.last %}, {% endif %}{% endfor %}</td>
<td>{{ money(order.total) }}</td><td>{{ order.note|default('-', true)|shout }}</td></tr>
{%- endmacro %}
""",
    "page.html": """{% extends "layout.html" %}
{% import "macros.html" as m %}
{% block title %}Orders {{ page }} - {{ super() }}{% endblock %}
{% block content %}
<h1>{{ heading|title }}</h1>
{% for group in orders|groupby("region") %}
<h2>{{ group.grouper|upper }} ({{ group.list|length }} orders, {{ m.money(group.list|sum(attribute="total")) }})</h2>
<table>
{% for order in group.list|sort(attribute="total", reverse=true) %}{{ m.row(order, loop) }}
{% endfor %}</table>
{% endfor %}
<p>Tags: {{ tags|map("lower")|unique|join(", ") }}</p>
<p>Mean: {{ (orders|sum(attribute="total") / (orders|length))|round(2) }}</p>
{% endblock %}
{% block footer %}{{ super() }} &middot; page {{ page }}{% endblock %}
""",
}

REGIONS = ["north", "south", "east", "west", "centre"]
WORDS = "alpha beta gamma delta <epsilon> zeta & eta theta 'iota' kappa lambda mu".split()


def environment():
    env = jinja2.Environment(
        loader=jinja2.DictLoader(TEMPLATES),
        autoescape=True,
        cache_size=50,
    )
    env.filters["shout"] = lambda s: str(s).upper() + "!"
    env.tests["big"] = lambda v: v > 500
    return env


def make_data(rng, page):
    users = [
        {
            "name": "%s <%d>" % (rng.choice(WORDS), i),
            "admin": rng.random() < 0.1,
            "bio": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))),
        }
        for i in range(12)
    ]
    orders = []
    for _ in range(rng.randint(40, 60)):
        lines = [{"sku": "SKU-%04d" % rng.randint(0, 9999), "qty": rng.randint(1, 9)} for _ in range(rng.randint(1, 5))]
        orders.append(
            {
                "region": rng.choice(REGIONS),
                "user": rng.choice(users),
                "lines": lines,
                "total": round(rng.uniform(1, 1000), 2),
                "note": rng.choice([None, "", "gift", "urgent & fragile", "<b>call</b>"]),
            }
        )
    return {
        "site": "pyfleet shop",
        "year": 2026,
        "page": page,
        "heading": "orders of the day %d" % page,
        "nav": [{"href": "/%s" % w, "label": w} for w in rng.sample(WORDS, 6)],
        "orders": orders,
        "tags": [rng.choice(WORDS).upper() for _ in range(20)],
    }


class Renderer:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.page = 0
        self.env = None

    def one_round(self):
        if self.page % RECOMPILE == 0:
            self.env = environment()
        self.page += 1
        html = self.env.get_template("page.html").render(make_data(self.rng, self.page))
        if "<epsilon>" in html:
            sys.exit("real_jinja.py: autoescape did not escape")
        return len(html)


def main():
    lifeline.start(LIFETIME)
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    r = Renderer(seed)
    for _ in range(RECOMPILE + 1):
        r.one_round()
    print("ready", flush=True)
    while True:
        r.one_round()


if __name__ == "__main__":
    main()
