"""Build order of a project's modules from their dependencies."""


class CycleError(ValueError):
    """Raised when no complete build order exists."""


def build_order(graph):
    raise NotImplementedError
