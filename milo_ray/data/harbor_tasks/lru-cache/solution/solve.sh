#!/bin/bash
set -euo pipefail
cat > /app/cache/lru.py <<'PY'
"""A least-recently-used cache. Specified in /app/cache/README.md."""

from collections import OrderedDict


def _valid(capacity):
    if type(capacity) is not int or capacity < 1:
        raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
    return capacity


class LRUCache:
    def __init__(self, capacity):
        self.capacity = _valid(capacity)
        self.hits = self.misses = 0
        self._data = OrderedDict()  # least recently used first

    def get(self, key, default=None):
        if key not in self._data:
            self.misses += 1
            return default
        self.hits += 1
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key, value):
        evicted = None
        if key in self._data:
            self._data.move_to_end(key)
        elif len(self._data) >= self.capacity:
            evicted = self._data.popitem(last=False)
        self._data[key] = value
        return evicted

    def peek(self, key, default=None):
        return self._data.get(key, default)

    def delete(self, key):
        return self._data.pop(key, _ABSENT) is not _ABSENT

    def keys(self):
        return list(self._data)

    def resize(self, capacity):
        self.capacity = _valid(capacity)
        return [self._data.popitem(last=False) for _ in range(len(self._data) - capacity)]

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data


_ABSENT = object()
PY
