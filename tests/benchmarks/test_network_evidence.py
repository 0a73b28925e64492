""""Needs the network" only on evidence (benchmarks/network_evidence.py): a fetch step of the
script itself reporting a failed fetch in its own words, or a command the script runs after
a fetch step not being found -- never a traceback a test prints while probing a blocked URL."""

from __future__ import annotations

import pytest

from milo_ray.benchmarks.harbor import diagnose
from milo_ray.benchmarks.network_evidence import fetch_failure, fetch_steps

PROBE_OUTPUTS = (
    "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>",
    "socket.gaierror: [Errno -2] Name or service not known",
    "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='example.com', port=443): Max retries exceeded "
    "(Caused by NewConnectionError('<urllib3.connection.HTTPSConnection>: Failed to establish a new connection: "
    "[Errno 101] Network is unreachable'))",
    "ConnectionRefusedError: [Errno 111] Connection refused",
    "Error: getaddrinfo EAI_AGAIN example.com",
)
PYTEST_RUNNER = "#!/bin/bash\ncd /app\npytest /tests/test_outputs.py -rA\n"


@pytest.mark.parametrize("output", PROBE_OUTPUTS)
def test_a_probe_traceback_is_never_evidence_with_or_without_the_script(output):
    assert fetch_failure(output, PYTEST_RUNNER) == ""
    assert fetch_failure(output, None) == ""
    assert diagnose(output, PYTEST_RUNNER) == ""


def test_a_curl_probe_is_not_a_fetch_step_but_a_curl_that_keeps_its_download_is():
    probe_error = "curl: (6) Could not resolve host: blocked.example"
    for probe in ("curl -sS --max-time 3 -o /dev/null http://blocked.example/ || echo blocked",
                  "curl -s -o /dev/null -w '%{http_code}' https://blocked.example", "curl http://blocked.example",
                  "wget --spider http://blocked.example", "wget -q -O /dev/null http://blocked.example"):
        assert fetch_steps(probe) == [], probe
        assert fetch_failure(probe_error, probe) == "", probe
    for install in ("curl -LsSf https://astral.sh/uv/install.sh | sh", "curl -fsSL https://x.example/i.sh -o /tmp/i.sh",
                    "curl -sSO https://x.example/runner.tgz", "wget -qO- https://x.example/i.sh | bash",
                    "wget https://x.example/runner.tgz"):
        assert [name for _, name, _ in fetch_steps(install)] in (["curl"], ["wget"]), install
    why = fetch_failure("curl: (6) Could not resolve host: astral.sh\n", "curl -LsSf https://astral.sh/uv/install.sh | sh\n")
    assert why == "`curl -LsSf https://astral.sh/uv/install.sh | sh` failed to download: curl: (6) Could not resolve host: astral.sh"
    # With the commands unknown, curl's words alone are what a probe prints: not evidence.
    assert fetch_failure(probe_error, None) == ""


@pytest.mark.parametrize("script,output", [
    ("pip install pytest==8.3", "ERROR: Could not find a version that satisfies the requirement pytest==8.3 (from versions: none)"),
    ("python3 -m pip install -r /tests/requirements.txt",
     "WARNING: Retrying (Retry(total=4, connect=None, read=None)) after connection broken by 'NewConnectionError(...)': /simple/pytest/"),
    ("uvx -p 3.13 -w pytest==8.4.1 pytest /tests/test_outputs.py",
     "error: Failed to fetch: `https://pypi.org/simple/pytest/`\n  Caused by: Request failed after 3 retries"),
    ("apt-get update && apt-get install -y curl", "W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease"),
    ("apt-get install -y jq", "Err:1 http://deb.debian.org/debian bookworm InRelease\n  Temporary failure resolving 'deb.debian.org'"),
    ("git clone https://github.com/x/y /tmp/y", "fatal: unable to access 'https://github.com/x/y/': Could not resolve host: github.com"),
    ("npm ci", "npm ERR! code EAI_AGAIN\nnpm ERR! request to https://registry.npmjs.org/jest failed"),
    ("wget https://x.example/runner.tgz", "wget: unable to resolve host address 'x.example'"),
])
def test_an_installers_own_report_of_a_failed_fetch_is_evidence(script, output):
    why = fetch_failure(output, f"#!/bin/bash\n{script}\n")
    assert why.startswith(f"`{script}` failed to download: "), why
    note = diagnose(output, script)
    assert "the test runner needs the network (" in note and script in note


def test_an_installers_report_counts_only_for_a_fetch_step_of_the_script():
    # A test that runs pip itself (a policy check that installing is refused) prints pip's
    # words; the script's own steps fetched nothing.
    refused = "ERROR: No matching distribution found for requests"
    assert fetch_failure(refused, PYTEST_RUNNER) == ""
    assert fetch_failure(refused, "pip install requests\n").startswith("`pip install requests` failed")
    # A commented-out step is no step.
    assert fetch_failure(refused, "# pip install requests (done in the image)\npytest\n") == ""


def test_a_command_not_found_after_a_fetch_step_is_evidence_but_python_is_not():
    script = ("curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\nsource $HOME/.local/bin/env\n"
              "uvx -p 3.13 -w pytest==8.4.1 pytest /tests/test_outputs.py\n")
    silent = "/tests/test.sh: line 3: uvx: command not found\n"  # curl -s printed nothing
    assert fetch_failure(silent, script) == ("`uvx` was not found after the fetch step "
                                             "`curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh` (it fetched nothing)")
    assert fetch_failure(silent, "uvx pytest /tests\n") == ""  # no fetch step before it: not the network's doing
    assert fetch_failure("/tests/test.sh: line 3: python: command not found\n", "pip install pytest\npython -m pytest\n") == ""


def test_the_reference_solution_is_named_when_its_fetch_fails():
    note = diagnose("curl: (7) Failed to connect to x.example port 443", "curl -fsSL https://x.example/a.tgz -o a.tgz\n",
                    who="the reference solution")
    assert note.startswith("the reference solution needs the network (`curl -fsSL https://x.example/a.tgz -o a.tgz`")


def test_a_failed_fetch_step_whose_tests_still_ran_and_reported_is_not_evidence():
    # The runner was there already (preinstalled, cached): the 0 is the answer's.
    script = "curl -LsSf https://astral.sh/uv/install.sh | sh\nuvx -w pytest pytest /tests/test_outputs.py -rA\n"
    failed = "curl: (6) Could not resolve host: astral.sh\n"
    assert fetch_failure(failed, script).startswith("`curl -LsSf")
    pytest_summary = "FAILED test_outputs.py::test_status\n==================== 1 failed, 3 passed in 0.52s ====================\n"
    assert fetch_failure(failed + pytest_summary, script) == ""
    assert fetch_failure(failed + "-" * 70 + "\nRan 4 tests in 0.003s\n\nFAILED (failures=1)\n", script) == ""
    assert diagnose(failed, script, reported=True) == ""  # the verifier wrote its CTRF report
