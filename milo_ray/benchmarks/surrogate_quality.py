"""The surrogate's quality model (a SIMULATOR): mechanisms + task -> outcome distribution.

For harness h (its detected mechanisms and parameters) and task t, each failure mode m
fires independently with hazard ``sigmoid(L[t, m] - shift[h, m] + kappa*log_time[h]*[m is
deadline_overrun])``. ``L`` holds the task's latent base logits (calibrated offset +
difficulty + log propensity); ``shift`` is the sum of the mechanisms' logit reductions
plus pairwise interaction terms (synergies > 0, conflicts < 0); every gate also costs
time, and time raises the deadline hazard. Modes are checked in FAILURE_MODES order;
the first that fires ends the attempt (its *ending*). No mode firing = all tests pass.
An ending with mode m passes each hidden test independently with probability
``credit[m]`` (a timeout passes almost nothing unless a scaffold floor exists); ``CREDIT``
unless the preset gives its benchmark's own (a pass/fail benchmark, a rubric's partial credit).

Everything is closed form: P(first = m) = h_m * prod_{m'<m}(1 - h_m'),
E[score] = P(none) + sum_m P(first=m) * credit_m, P(resolve) = P(none) + sum_m
P(first=m) * credit_m ** n_tests, and tokens/seconds are ending-weighted means.
The same arrays drive the executor's sampling, so sampled means converge to these.
The model is vectorized over mechanism subsets for the exhaustive optimum search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from milo_ray.harness.mechanisms import FAILURE_MODES, MECHANISMS

NAMES: tuple[str, ...] = tuple(MECHANISMS)
IDX = {n: i for i, n in enumerate(NAMES)}
M = len(FAILURE_MODES)
MODE = {m: i for i, m in enumerate(FAILURE_MODES)}
DEAD = MODE["deadline_overrun"]
KAPPA = 2.0  # how strongly extra agent time turns into deadline overruns
# Fraction of tests passed when an ending occurs, per mode (deadline floor-adjusted below).
CREDIT = np.array([0.50, 0.04, 0.70, 0.25, 0.35, 0.30])
# Token / seconds multipliers per ending: [success, *FAILURE_MODES]; deadline seconds = cap.
TOKEN_MULT = np.array([1.0, 0.7, 1.3, 0.9, 1.1, 1.2, 1.0])
SECOND_MULT = np.array([1.0, 0.7, 1.0, 0.9, 1.1, 1.1, 1.0])
MAX_SECONDS_FRAC = 0.6  # nominal non-timeout seconds never exceed this share of the cap


def _v(**modes: float) -> np.ndarray:
    out = np.zeros(M)
    for k, val in modes.items():
        out[MODE[k]] = val
    return out


def _q(g: float, half: float = 0.5) -> float:
    """Diminishing returns of repeated gates: 1, 1.5, 1.75 ... for g = 1, 2, 3."""
    return (1.0 - half ** max(g, 0.0)) / (1.0 - half)


@dataclass
class Term:
    """One linear or pairwise contribution: logit reductions, log time/token factors,
    and an additive change of the deadline ending's partial credit."""

    shift: np.ndarray
    log_time: float = 0.0
    log_tokens: float = 0.0
    floor: float = 0.0


def single_terms(params: dict[str, dict[str, Any]]) -> dict[str, Term]:
    """The stand-alone effect of each mechanism at the given (or default) parameters."""
    P = {n: {**MECHANISMS[n].params, **params.get(n, {})} for n in NAMES}
    t: dict[str, Term] = {}
    t["deepagents_stack"] = Term(_v(context_overflow=0.6, tool_misuse=0.4), 0.05, 0.10)
    t["scientist_protocol"] = Term(_v(lax_verification=0.35, premature_completion=0.2), 0.05, 0.05)
    t["plan_protocol"] = Term(_v(premature_completion=0.25, missing_knowhow=0.1), 0.03, 0.03)
    t["delegation_protocol"] = Term(_v(context_overflow=0.1), 0.0, 0.02)
    t["plan_nudge"] = Term(_v(premature_completion=0.1), 0.01, 0.02)
    g = P["plan_gate"]["max_gates"]
    t["plan_gate"] = Term(_v(premature_completion=0.3 * _q(g)), 0.06 * g, 0.05 * g)
    t["explorer_subagent"] = Term(_v(context_overflow=0.4, missing_knowhow=0.15), 0.08, 0.15)
    t["coder_subagent"] = Term(_v(tool_misuse=0.3, context_overflow=0.2), 0.05, 0.10)
    t["verifier_subagent"] = Term(_v(lax_verification=0.15), 0.02, 0.05)
    g = P["completion_gate"]["max_gates"]
    t["completion_gate"] = Term(_v(), 0.02 * g, 0.02 * g)  # hollow without a verifier to dispatch
    i = P["rubric_gate"]["max_iterations"]
    t["rubric_gate"] = Term(_v(premature_completion=0.45 * _q(i), lax_verification=0.35 * _q(i)), 0.08 * i, 0.08 * i)
    g, r = P["verifier_gate"]["max_gates"], P["verifier_gate"]["relax_frac"]
    t["verifier_gate"] = Term(_v(premature_completion=0.15 * _q(g)), 0.03 * g * r, 0.03 * g)
    w, f = P["deadline_governor"]["warn_frac"], P["deadline_governor"]["final_frac"]
    fit = math.exp(-(((f - 0.8) / 0.12) ** 2)) * (1.0 - 0.3 * max(0.0, w - 0.5) / 0.1 * 0.5)
    t["deadline_governor"] = Term(
        _v(deadline_overrun=0.7 * fit, premature_completion=-0.3 * max(0.0, 0.8 - f) / 0.1 - 0.1 * max(0.0, 0.5 - w) / 0.1),
        -0.05, 0.02)
    t["scaffold_floor"] = Term(_v(deadline_overrun=0.1, premature_completion=-0.15), 0.02, 0.03, floor=0.40)
    c = float(P["context_clamp"]["max_chars"])
    strength = 0.3 + 0.5 * min(1.0, max(0.0, math.log(40000.0 / c) / math.log(10.0)))
    lax_pen = 0.3 * min(1.0, max(0.0, math.log(16000.0 / c) / math.log(4.0))) ** 2
    t["context_clamp"] = Term(_v(context_overflow=strength, lax_verification=-lax_pen, missing_knowhow=-lax_pen / 2),
                              0.0, -0.1 * strength + 0.03)
    t["edit_tool"] = Term(_v(tool_misuse=0.35), 0.0, 0.0)
    t["skills_library"] = Term(_v(missing_knowhow=0.5), 0.01, 0.03)
    n = P["reflection_memory"]["max_notes"]
    sat = 1.0 - math.exp(-n / 3.0)
    t["reflection_memory"] = Term(_v(tool_misuse=0.3 * sat, missing_knowhow=0.18 * sat), 0.01, 0.02 * n)
    g = P["anti_stub_check"]["max_gates"]
    t["anti_stub_check"] = Term(_v(premature_completion=0.15 * _q(g)), 0.02 * g, 0.02 * g)
    return t


def pair_terms(params: dict[str, dict[str, Any]]) -> dict[tuple[str, str], Term]:
    """Interactions: a mechanism that helps only with a partner, redundancy, conflicts."""
    P = {n: {**MECHANISMS[n].params, **params.get(n, {})} for n in NAMES}
    gc = P["completion_gate"]["max_gates"]
    gv, r = P["verifier_gate"]["max_gates"], P["verifier_gate"]["relax_frac"]
    rel = 0.6 + 0.4 * r
    return {
        ("completion_gate", "verifier_subagent"): Term(
            _v(lax_verification=0.35 * _q(gc), premature_completion=0.3 * _q(gc)), 0.10 * gc, 0.12 * gc),
        ("verifier_gate", "verifier_subagent"): Term(
            _v(lax_verification=0.75 * _q(gv) * rel, premature_completion=0.55 * _q(gv) * rel),
            0.10 * gv * r, 0.10 * gv),
        ("rubric_gate", "verifier_gate"): Term(_v(lax_verification=-0.3, premature_completion=-0.25), 0.10, 0.08),
        ("completion_gate", "verifier_gate"): Term(_v(premature_completion=-0.2), 0.05, 0.05),
        ("rubric_gate", "scientist_protocol"): Term(_v(lax_verification=0.2, premature_completion=0.1)),
        ("plan_protocol", "scientist_protocol"): Term(_v(premature_completion=-0.2, lax_verification=-0.15), 0.02),
        ("plan_nudge", "plan_protocol"): Term(_v(premature_completion=0.15)),
        ("plan_gate", "plan_nudge"): Term(_v(premature_completion=0.10)),
        ("deadline_governor", "verifier_gate"): Term(_v(deadline_overrun=0.25), -0.03 * gv),
        ("deadline_governor", "scaffold_floor"): Term(_v(deadline_overrun=0.15), 0.0, 0.0, floor=0.10),
        ("anti_stub_check", "scaffold_floor"): Term(_v(premature_completion=0.25)),
        ("delegation_protocol", "explorer_subagent"): Term(_v(context_overflow=0.2, missing_knowhow=0.1)),
        ("coder_subagent", "delegation_protocol"): Term(_v(tool_misuse=0.1, context_overflow=0.1)),
        ("deepagents_stack", "edit_tool"): Term(_v(tool_misuse=-0.2)),  # the stack already has edit_file
        ("context_clamp", "deepagents_stack"): Term(_v(context_overflow=-0.15)),  # summarization overlaps
    }


@dataclass
class Tables:
    """Effects as arrays for vectorized evaluation: W (n, M), time/tokens/floor (n,),
    and pairs as index arrays (k,) with their own arrays."""

    W: np.ndarray
    lt: np.ndarray
    ltok: np.ndarray
    floor: np.ndarray
    pi: np.ndarray
    pj: np.ndarray
    PW: np.ndarray
    plt: np.ndarray
    pltok: np.ndarray
    pfloor: np.ndarray
    credit: np.ndarray  # (M,) per-mode partial credit of the benchmark (CREDIT unless a preset sets its own)


def build_tables(params: dict[str, dict[str, Any]], scale: float, credit: Any = None) -> Tables:
    """``credit``: per-FAILURE_MODES chance a hidden test passes after that ending (None: ``CREDIT``);
    a pass/fail benchmark needs its own, as ``CREDIT``'s lucky passes alone would put a floor
    under its resolve rate."""
    st = single_terms(params)
    pt = pair_terms(params)
    W = np.stack([st[n].shift for n in NAMES]) * scale
    pairs = list(pt.items())
    return Tables(
        W=W, lt=np.array([st[n].log_time for n in NAMES]), ltok=np.array([st[n].log_tokens for n in NAMES]),
        floor=np.array([st[n].floor for n in NAMES]),
        pi=np.array([IDX[a] for (a, _), _t in pairs]), pj=np.array([IDX[b] for (_a, b), _t in pairs]),
        PW=np.stack([t.shift for _k, t in pairs]) * scale, plt=np.array([t.log_time for _k, t in pairs]),
        pltok=np.array([t.log_tokens for _k, t in pairs]), pfloor=np.array([t.floor for _k, t in pairs]),
        credit=CREDIT.copy() if credit is None else np.asarray(credit, dtype=float),
    )


@dataclass
class Aggregate:
    shift: np.ndarray  # (S, M)
    log_time: np.ndarray  # (S,)
    log_tokens: np.ndarray  # (S,)
    floor: np.ndarray  # (S,)
    credit: np.ndarray  # (M,) the tables' per-mode partial credit


def aggregate(X: np.ndarray, tb: Tables) -> Aggregate:
    """X: (S, n) 0/1 mechanism indicators -> summed effects per subset."""
    X = np.asarray(X, dtype=float)
    both = X[:, tb.pi] * X[:, tb.pj]  # (S, k)
    return Aggregate(X @ tb.W + both @ tb.PW, X @ tb.lt + both @ tb.plt, X @ tb.ltok + both @ tb.pltok,
                     X @ tb.floor + both @ tb.pfloor, tb.credit)


@dataclass
class TaskArrays:
    """Latent task quantities stacked over a split: L (T, M), n_tests, tokens, seconds, caps."""

    L: np.ndarray
    n_tests: np.ndarray
    tokens: np.ndarray
    seconds: np.ndarray
    caps: np.ndarray


def ending_probs(agg: Aggregate, ta: TaskArrays) -> np.ndarray:
    """P(ending) (S, T, 1+M): column 0 = success (no mode fired), then first-mode-fired."""
    logits = ta.L[None, :, :] - agg.shift[:, None, :]
    logits[:, :, DEAD] += KAPPA * agg.log_time[:, None]
    h = 1.0 / (1.0 + np.exp(-logits))
    surv = np.cumprod(1.0 - h, axis=2)
    before = np.concatenate([np.ones_like(surv[:, :, :1]), surv[:, :, :-1]], axis=2)
    return np.concatenate([surv[:, :, -1:], h * before], axis=2)


def credits(agg: Aggregate) -> np.ndarray:
    """Per-ending pass probability of each hidden test (S, 1+M)."""
    c = np.broadcast_to(np.concatenate([[1.0], agg.credit]), (agg.floor.shape[0], 1 + M)).copy()
    c[:, 1 + DEAD] = np.clip(agg.credit[DEAD] + agg.floor, 0.0, 0.95)
    return c


def nominal_seconds(agg: Aggregate, ta: TaskArrays) -> np.ndarray:
    """Mean agent seconds of a non-timeout attempt (S, T), capped below the time cap."""
    return np.minimum(ta.seconds[None, :] * np.exp(agg.log_time)[:, None], MAX_SECONDS_FRAC * ta.caps[None, :])


def expectations(agg: Aggregate, ta: TaskArrays) -> dict[str, np.ndarray]:
    """Exact per-subset means over the tasks: score, resolve_rate, output_tokens, seconds (S,)."""
    pe = ending_probs(agg, ta)  # (S, T, E)
    cr = credits(agg)  # (S, E)
    score = (pe * cr[:, None, :]).sum(axis=2)
    resolve = (pe * cr[:, None, :] ** ta.n_tests[None, :, None]).sum(axis=2)
    tok = ta.tokens[None, :] * np.exp(agg.log_tokens)[:, None] * (pe * TOKEN_MULT[None, None, :]).sum(axis=2)
    nom = nominal_seconds(agg, ta)
    sec_mult = (pe * SECOND_MULT[None, None, :]).sum(axis=2) - pe[:, :, 1 + DEAD] * SECOND_MULT[1 + DEAD]
    sec = nom * sec_mult + pe[:, :, 1 + DEAD] * ta.caps[None, :]
    return {"score": score.mean(axis=1), "resolve_rate": resolve.mean(axis=1),
            "output_tokens": tok.mean(axis=1), "seconds": sec.mean(axis=1)}


def indicator(mechs: dict[str, dict[str, Any]]) -> np.ndarray:
    x = np.zeros((1, len(NAMES)))
    for n in mechs:
        if n in IDX:
            x[0, IDX[n]] = 1.0
    return x
