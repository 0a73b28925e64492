"""Operations on sets of half-open intervals [start, end). See /app/SPEC.md."""


def merge(intervals):
    raise NotImplementedError


def total_length(intervals):
    raise NotImplementedError


def subtract(intervals, removed):
    raise NotImplementedError


def gaps(intervals, lo, hi):
    raise NotImplementedError
