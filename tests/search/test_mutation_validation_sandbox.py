"""A mutation's child is import-checked in the run's kind of sandbox (``ValidationOptions.sandbox``)."""

from __future__ import annotations

import shutil
import socket
import textwrap

import pytest

from milo_ray.harness.model import Harness
from milo_ray.search.mutation import ValidationOptions, _validate

LOCAL = {"_target_": "milo_ray.boundary.sandbox.local.LocalSandboxFactory"}

# The child says where its import ran: bwrap names its host "sandbox", the local sandbox
# keeps the machine's name.
_PROBE = textwrap.dedent('''
    import socket
    raise RuntimeError("HOST=" + socket.gethostname())
    def build_agent(model, backend):
        return None
    ''')


def _host_seen(sandbox):
    parent = Harness.from_source("def build_agent(model, backend):\n    return None\n")
    reason = _validate(Harness.from_source(_PROBE), parent, ValidationOptions(timeout_s=30, sandbox=sandbox))
    assert reason and "HOST=" in reason, reason
    return reason.split("HOST=", 1)[1].split()[0]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_child_is_checked_in_the_runs_sandbox_kind_and_in_bwrap_by_default():
    assert _host_seen(None) == "sandbox"
    assert _host_seen(LOCAL) == socket.gethostname()
