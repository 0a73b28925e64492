#!/bin/bash
set -euo pipefail
cat > /app/calc/evaluator.py <<'PY'
"""A small arithmetic expression evaluator (see /app/calc/GRAMMAR.md): a tokenizer and a
recursive-descent parser that evaluates while it parses."""

import operator
import re

TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)|([A-Za-z_]\w*)|(\*\*|//|[-+*/%()]))")
BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
          "//": operator.floordiv, "%": operator.mod, "**": operator.pow}


def tokenize(expr):
    tokens, pos = [], 0
    while pos < len(expr.rstrip()):
        m = TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"unexpected character at {pos}: {expr[pos:].strip()[:1]!r}")
        number, name, op = m.groups()
        if number:
            tokens.append(("num", float(number) if "." in number else int(number)))
        elif name:
            tokens.append(("name", name))
        else:
            tokens.append(("op", op))
        pos = m.end()
    return tokens


class Parser:
    def __init__(self, tokens, variables):
        self.tokens, self.pos, self.variables = tokens, 0, variables or {}

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else (None, None)

    def take_op(self, *ops):
        kind, value = self.peek()
        if kind == "op" and value in ops:
            self.pos += 1
            return value
        return None

    def apply(self, op, left, right):
        try:
            return BINARY[op](left, right)
        except ZeroDivisionError as exc:
            raise ValueError(f"{op}: {exc}") from None

    def sum(self):
        value = self.product()
        while op := self.take_op("+", "-"):
            value = self.apply(op, value, self.product())
        return value

    def product(self):
        value = self.unary()
        while op := self.take_op("*", "/", "//", "%"):
            value = self.apply(op, value, self.unary())
        return value

    def unary(self):
        if op := self.take_op("-", "+"):
            value = self.unary()
            return -value if op == "-" else +value
        return self.power()

    def power(self):
        base = self.atom()
        if self.take_op("**"):
            return self.apply("**", base, self.unary())  # right-assoc; exponent may be signed
        return base

    def atom(self):
        kind, value = self.peek()
        self.pos += 1
        if kind == "num":
            return value
        if kind == "name":
            if value not in self.variables:
                raise ValueError(f"unknown name {value!r}")
            return self.variables[value]
        if (kind, value) == ("op", "("):
            inner = self.sum()
            if not self.take_op(")"):
                raise ValueError("missing ')'")
            return inner
        raise ValueError(f"expected a number, name or '(' but got {value!r}")


def evaluate(expr, variables=None):
    parser = Parser(tokenize(expr), variables)
    value = parser.sum()
    if parser.pos != len(parser.tokens):
        raise ValueError(f"unexpected {parser.peek()[1]!r} after a complete expression")
    return value
PY
