"""The LLM client every model call goes through: litellm calls with retries and the
rate limit per provider account (:mod:`.client`, :mod:`.rate_limit`), token usage and prices
(:mod:`.usage`), and the calls of each role and of solvers (:mod:`.role_llm`,
:mod:`.solver_calls`). It sits below the trust boundary: the model gateway forwards a
sandboxed harness's calls through it, holding the keys a sandbox never sees."""
