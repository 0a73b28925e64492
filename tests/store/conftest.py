import pytest

# The contract suite lives in the package; rewrite its asserts for readable failures.
pytest.register_assert_rewrite("milo_ray.testing")
