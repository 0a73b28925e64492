"""A least-recently-used cache. Implement the class as specified in /app/cache/README.md."""


class LRUCache:
    pass
