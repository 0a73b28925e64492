#!/bin/bash
set -euo pipefail
cat > /app/intervals/ops.py <<'PY'
"""Operations on sets of half-open intervals [start, end). See /app/SPEC.md."""


def _checked(intervals):
    out = []
    for start, end in intervals:
        if start > end:
            raise ValueError(f"interval ({start}, {end}) has start > end")
        out.append((start, end))
    return out


def merge(intervals):
    result = []
    for start, end in sorted(iv for iv in _checked(intervals) if iv[0] < iv[1]):
        if result and start <= result[-1][1]:
            result[-1] = (result[-1][0], max(result[-1][1], end))
        else:
            result.append((start, end))
    return result


def total_length(intervals):
    return sum(end - start for start, end in merge(intervals))


def subtract(intervals, removed):
    cuts = merge(removed)
    result = []
    for start, end in merge(intervals):
        for cut_start, cut_end in cuts:
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                result.append((start, cut_start))
            start = max(start, cut_end)
            if start >= end:
                break
        if start < end:
            result.append((start, end))
    return result


def gaps(intervals, lo, hi):
    if lo > hi:
        raise ValueError(f"lo={lo} > hi={hi}")
    return subtract([(lo, hi)], intervals)
PY
