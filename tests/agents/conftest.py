import pytest

from milo_ray.testing.openai_server import SCRIPTED_KEY_ENV


@pytest.fixture
def key_env(monkeypatch):
    """The scripted model's key, set for the test (the name of its variable is returned)."""
    monkeypatch.setenv(SCRIPTED_KEY_ENV, "local-secret")
    return SCRIPTED_KEY_ENV
