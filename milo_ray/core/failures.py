"""Which failures are the model endpoint's rather than the caller's.

The rollout executor, the harness process inside the sandbox and the search agents all
sort an exception the same way: an endpoint failure (past its retries) is infrastructure,
anything else is the harness's or the agent's own fault. Checked by the exception's
class hierarchy, so nothing here imports the client libraries (``import litellm`` takes
seconds)."""

from __future__ import annotations

_ENDPOINT_PACKAGES = ("litellm", "openai", "httpx", "httpcore")


def is_endpoint_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the model endpoint failing (litellm/openai/httpx errors: rate
    limits, server errors, timeouts, refused connections, bad credentials) rather than
    the caller's own code."""
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] in _ENDPOINT_PACKAGES:
            return True
    return False
