"""Invariants of the embedders: unit-norm float32 rows, offline loading, fallback, caching."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest

from milo_ray.agents import embedder as embedder_module
from milo_ray.agents.embedder import (PACKAGED_MODEL_NAME, EmbedderLoad, HashingEmbedder, SentenceTransformerEmbedder,
                                      watch_loads)
from milo_ray.agents.protocols import Embedder

UNAVAILABLE = "milo-ray-tests/no-such-embedding-model"
SENTENCES = [
    "The agent stopped before running the test suite.",
    "The assistant finished without executing the tests.",
    "Quarterly revenue grew thanks to strong retail sales.",
]


@pytest.fixture(scope="module")
def packaged():
    emb = SentenceTransformerEmbedder("packaged")
    emb.dim  # loads the model: tests that reach into ``_model`` must not depend on which test ran first
    return emb


def assert_unit_rows(z: np.ndarray, n: int, d: int) -> None:
    assert z.dtype == np.float32 and z.shape == (n, d)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)


def test_packaged_model_loads_offline_with_unit_norm_384d_rows(packaged):
    z = packaged.embed(SENTENCES)
    assert_unit_rows(z, 3, 384)
    assert packaged.used_model == PACKAGED_MODEL_NAME and packaged.model_name == PACKAGED_MODEL_NAME
    assert not packaged.fell_back
    assert isinstance(packaged, Embedder)


def test_paraphrases_are_closer_than_unrelated_sentences(packaged):
    z = packaged.embed(SENTENCES)
    cos = z @ z.T
    assert cos[0, 1] > cos[0, 2] + 0.2
    assert cos[0, 1] > cos[1, 2] + 0.2


def test_empty_input_gives_zero_rows_of_model_width(packaged):
    z = packaged.embed([])
    assert z.shape == (0, 384) and z.dtype == np.float32


def test_repeated_texts_are_encoded_once_and_rows_are_identical(packaged, monkeypatch):
    emb = SentenceTransformerEmbedder("packaged")
    emb._model, emb._dim, emb.used_model = packaged._model, packaged._dim, packaged.used_model
    encoded: list[str] = []
    real = packaged._model.encode

    def counting(texts, **kw):
        encoded.extend(texts)
        return real(texts, **kw)

    monkeypatch.setattr(emb._model, "encode", counting)
    z1 = emb.embed(["alpha beta", "gamma", "alpha beta"])
    z2 = emb.embed(["gamma", "delta"])
    assert encoded == ["alpha beta", "gamma", "delta"]
    np.testing.assert_array_equal(z1[0], z1[2])
    np.testing.assert_array_equal(z1[1], z2[0])


@pytest.fixture
def fresh_warnings(monkeypatch):
    """The fallback warning is once per process: each test starts with none given yet."""
    monkeypatch.setattr(embedder_module, "_warned", set())


def test_unavailable_model_falls_back_to_packaged_with_one_warning_and_names_the_model_used(caplog, fresh_warnings):
    emb = SentenceTransformerEmbedder(UNAVAILABLE, fallback_to_packaged=True)
    assert emb.used_model is None and emb.requested_model == UNAVAILABLE  # lazy: nothing loaded yet
    loads: list[EmbedderLoad] = []
    with caplog.at_level(logging.WARNING, logger="milo_ray.agents.embedder"), watch_loads(loads.append):
        z = emb.embed(SENTENCES[:2])
        again = SentenceTransformerEmbedder(UNAVAILABLE, fallback_to_packaged=True)  # a second one, same model
        again.embed(SENTENCES[:1])
    assert_unit_rows(z, 2, 384)
    # model_name (what experience rows record) names the model that produced the rows
    assert emb.model_name == PACKAGED_MODEL_NAME and emb.used_model == PACKAGED_MODEL_NAME and emb.fell_back
    assert [(x.requested, x.used, x.fell_back) for x in loads] == [(UNAVAILABLE, PACKAGED_MODEL_NAME, True)] * 2
    assert loads[0].reason
    warnings = [r for r in caplog.records if r.name == "milo_ray.agents.embedder"]
    assert len(warnings) == 1, "the fallback is announced once per process, not once per embedder"
    msg = warnings[0].getMessage()
    assert UNAVAILABLE in msg and PACKAGED_MODEL_NAME in msg and "\n" not in msg


def test_without_fallback_in_the_config_an_unavailable_model_is_an_error_not_a_silent_substitute(fresh_warnings):
    loads: list[EmbedderLoad] = []
    with watch_loads(loads.append):
        for emb in (SentenceTransformerEmbedder(UNAVAILABLE),  # the default: no fallback
                    SentenceTransformerEmbedder(UNAVAILABLE, fallback_to_packaged=False)):
            with pytest.raises(RuntimeError, match="fallback_to_packaged"):
                emb.embed(["x"])
            assert emb.used_model is None and not emb.fell_back
    assert loads == []


def test_a_load_that_needs_no_fallback_is_reported_as_such(packaged):
    loads: list[EmbedderLoad] = []
    with watch_loads(loads.append):
        SentenceTransformerEmbedder("packaged").embed(["x"])
    assert [(x.requested, x.used, x.fell_back) for x in loads] == [("packaged", PACKAGED_MODEL_NAME, False)]


def test_embedder_pickles_without_its_model(packaged):
    packaged.embed(["warm"])
    clone = pickle.loads(pickle.dumps(packaged))
    assert clone._model is None
    np.testing.assert_allclose(clone.embed(["warm"]), packaged.embed(["warm"]), atol=1e-6)


def test_single_string_is_rejected():
    with pytest.raises(ValueError, match="texts"):
        HashingEmbedder().embed("not a list")


def test_hashing_embedder_is_deterministic_unit_norm_and_overlap_sensitive():
    a, b = HashingEmbedder(dim=128), HashingEmbedder(dim=128)
    texts = ["run the tests before finishing", "always run the tests first", "budget spreadsheet", ""]
    z = a.embed(texts)
    assert_unit_rows(z, 4, 128)
    np.testing.assert_array_equal(z, b.embed(texts))
    cos = z @ z.T
    assert cos[0, 1] > cos[0, 2]
    assert a.embed([]).shape == (0, 128)
    assert isinstance(a, Embedder) and a.model_name == a.used_model == "hashing-128-ngram2" and not a.fell_back
