"""Splitting a list of items into numbered pages (pages are numbered from 1)."""


def page_count(total, per_page):
    """Number of pages needed for `total` items shown `per_page` at a time (0 items -> 0 pages)."""
    if per_page < 1:
        raise ValueError("per_page must be >= 1")
    return total // per_page


def paginate(items, page, per_page):
    """The items shown on `page` (1-based); an empty list past the last page.
    ValueError if page < 1 or per_page < 1."""
    if page < 1 or per_page < 1:
        raise ValueError("page and per_page must be >= 1")
    start = page * per_page
    return items[start:start + per_page]


def page_of(index, per_page):
    """The 1-based page on which the item at 0-based `index` appears."""
    if index < 0 or per_page < 1:
        raise ValueError("index must be >= 0 and per_page >= 1")
    return index // per_page
