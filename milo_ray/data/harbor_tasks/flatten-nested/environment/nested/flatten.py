"""Flattening nested JSON-like data into dotted paths."""


def flatten(data, prefix="", out={}):
    """Flatten nested dicts and lists into a dict {dotted path: leaf value}.

    Dict keys become path parts as str(key); list items use their index. A path's parts are
    joined with ".". Leaves are all values that are not dicts or lists, plus EMPTY dicts and
    lists (kept as {} / []). `flatten({"a": {"b": [1, {"c": 2}]}, "d": {}})` ==
    `{"a.b.0": 1, "a.b.1.c": 2, "d": {}}`. A top-level empty dict or list flattens to {}.
    """
    for key, value in data.items():
        path = prefix + "." + str(key) if prefix else str(key)
        if isinstance(value, dict):
            flatten(value, path)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                flatten(item, path + "." + str(i), out)
        else:
            out[path] = value
    return out
