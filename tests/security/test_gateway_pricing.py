"""A metered call's USD is litellm's price for its tokens, whatever shortcut the gateway
takes to compute it: linear rates learnt once per model only where litellm's price is
linear, litellm itself for tiered prices, None for a model litellm cannot price, and the
config's own prices when it sets them."""

from __future__ import annotations

import math
import random

import pytest

from milo_ray.boundary.gateway import upstream
from milo_ray.llm.client import price

# Token counts on both sides of every context tier litellm prices (128k, 200k, 272k).
COUNTS = [(0, 0), (1, 1), (999, 17), (127_999, 2), (128_001, 2), (199_999, 10), (200_001, 10), (272_001, 5),
          (1_000_000, 100_000)] + [(random.Random(i).randint(0, 400_000), random.Random(-i).randint(0, 100_000))
                                   for i in range(40)]


@pytest.mark.parametrize("solver", ["openai/gpt-4o-mini", "anthropic/claude-sonnet-4-5", "gemini/gemini-2.5-pro",
                                    "openai/not-a-model-litellm-knows"])
def test_a_calls_price_is_litellms_price_for_its_tokens(solver):
    cfg = {"solver": solver}
    for tin, tout in COUNTS:
        got, want = upstream.call_price(cfg, tin, tout), price(cfg, tin, tout)
        assert (got is None) == (want is None), (tin, tout)
        assert got is None or math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15), (solver, tin, tout, got, want)


def test_a_tiered_price_is_never_taken_for_a_linear_one():
    upstream.call_price({"solver": "gemini/gemini-2.5-pro"}, 1, 1)
    assert upstream._RATES["gemini/gemini-2.5-pro"][2] == "litellm"


def test_the_configs_own_prices_win():
    cfg = {"solver": "openai/gpt-4o-mini", "usd_per_mtok_input": 1.0, "usd_per_mtok_output": 3.0}
    assert upstream.call_price(cfg, 2_000_000, 1_000_000) == pytest.approx(5.0)
