"""One run's model calls for the cluster-wide rate limit test (tests/llm/test_account_rate_limit.py):
joins the Ray cluster at ADDRESS in a namespace of its own (as each run's driver does), then
calls the scripted model at API_BASE from THREADS threads as fast as its limiter lets it,
for SECONDS, through the same client (and so the same account limiter) a run uses.

    python rate_limit_driver.py ADDRESS API_BASE RPM SECONDS THREADS

Prints ``{"ready": true, "namespace": ...}`` once joined and its limiter is up, waits for a
line on stdin (so both drivers start together), then ``{"calls": N}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid


def main() -> None:
    address, api_base, rpm, seconds, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), \
        int(sys.argv[5])
    import ray

    from milo_ray.config.schemas import ModelConfig
    from milo_ray.llm.client import build_chat_model
    from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV

    ray.init(address=address, namespace=f"run-{uuid.uuid4().hex[:8]}", log_to_driver=False)
    cfg = ModelConfig(solver="openai/scripted", id=f"model-{uuid.uuid4().hex[:6]}", api_base=api_base,
                      api_key_env=SCRIPTED_KEY_ENV, rpm=rpm, max_retries=0).check()
    model = build_chat_model(cfg)  # the account's limiter, found (or created) on the cluster
    warm = build_chat_model(cfg, rate_limiter=None)
    warm.invoke("warm up")  # litellm's client set-up, outside the measured calls (not limited: one request)
    print(json.dumps({"ready": True, "namespace": ray.get_runtime_context().namespace}), flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + seconds
    calls = [0] * threads

    def loop(i: int) -> None:
        while time.monotonic() < deadline:
            model.invoke("hi")
            calls[i] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    print(json.dumps({"calls": sum(calls)}), flush=True)


if __name__ == "__main__":
    main()
