"""Which failures are the model endpoint's rather than the caller's, as a caller in its
own process sees them.

The search agents sort an exception this way: an endpoint failure (past its retries) is
the model call's, anything else the agent's own fault. The harness process inside the
sandbox uses it too, but only to say what it saw (``endpoint_error``, informational): a
rollout's failure class is decided on the host, by the model gateway's record of the
call that failed (:meth:`milo_ray.boundary.gateway.ledger.Grant.endpoint_failure`), never
by what the harness reports. Checked by the exception's class hierarchy, so nothing here
imports the client libraries (``import litellm`` takes seconds)."""

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
