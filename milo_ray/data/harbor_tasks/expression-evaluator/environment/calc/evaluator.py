"""A small arithmetic expression evaluator (see /app/calc/GRAMMAR.md)."""


def evaluate(expr, variables=None):
    raise NotImplementedError
