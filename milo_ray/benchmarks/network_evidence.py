"""When a failed verifier (or reference solution) is blamed on the network: only on evidence.

The rule. "Needs the network" is said only when the output shows that a *fetch step of the
script itself* failed to get what it fetches:

* an installer or downloader the script runs (pip, uv/uvx, apt, npm/npx/yarn/pnpm, git,
  go, cargo, gem, and curl/wget when they fetch something that is kept) reporting, in its
  own words, that it could not resolve, connect or find what it fetches -- ``ERROR: No
  matching distribution found``, ``error: Failed to fetch``, ``curl: (6) Could not resolve
  host``, ``Temporary failure resolving 'deb.debian.org'``, ``fatal: unable to access``;
* or a command the script runs after a fetch step not being found (``uvx: command not
  found`` after ``curl ... install.sh | sh`` printed nothing: the installer fetched nothing).

And only when the tests then did not report: a failed fetch step followed by a test runner's
summary (pytest's ``== 3 passed, 1 failed in 0.2s ==``, unittest's ``Ran 4 tests``) or a CTRF
report means the runner was there already (preinstalled, cached); the score is the answer's.

Never on a bare exception or traceback -- ``Temporary failure in name resolution``,
``ConnectionError``, ``Connection refused``, ``Network is unreachable`` printed by a test:
a verifier may probe a blocked URL on purpose (a task about network policy checks that the
agent's sandbox could not get out), and the traceback it expects is not a failed install.
Likewise a ``curl``/``wget`` counts as a fetch step only when what it fetches is kept (piped
into a shell or an interpreter, or written to a file other than ``/dev/null``); a bare
``curl URL`` or ``wget --spider URL`` is a probe.

``script`` is the text of the commands that ran (a Harbor task's ``tests/*.sh``, its
``solution/solve.sh``). When it is unknown (None), an installer's own report alone is the
evidence (not curl's or wget's: those are what a probe prints); a bare traceback never is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A command word starts here: not inside another word, a path or an option.
_W = r"(?<![\w./-])"


@dataclass(frozen=True)
class FetchTool:
    """An installer or downloader: a script line that fetches with it (``step``) and a
    line of its output reporting that the fetch failed (``failed``)."""

    name: str
    step: re.Pattern[str]
    failed: re.Pattern[str]


def _re(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


# curl/wget keep what they fetch when it is piped on, or written to a real file.
_KEPT = r"(?:\|\s*(?:sudo\s+)?(?:env\s+\S+=\S+\s+)?(?:ba|z|da)?sh\b|\|\s*python3?\b|\s-o\s*(?!/dev/null)[^\s-]|" \
        r"\s--output[= ](?!/dev/null)|\s-[a-zA-Z]*O\b(?!\s*/dev/null)(?!\s*-(?:\s|$))|\s--remote-name\b)"

TOOLS: tuple[FetchTool, ...] = (
    FetchTool("pip", _re(rf"{_W}(?:pip3?|python3? -m pip|uv pip) (?:install|download)\b"),
              _re(r"^\s*(?:ERROR: )?(?:Could not find a version that satisfies the requirement|"
                  r"No matching distribution found for)|^\s*WARNING: Retrying \(Retry\(.*after connection broken by|"
                  r"Could not fetch URL https?://", re.M)),
    FetchTool("uv", _re(rf"{_W}(?:uv (?:add|sync|lock|run --with|tool install|python install|pip install)\b|uvx\b)"),
              _re(r"^\s*(?:error: |× |[├╰]─▶ )?(?:Failed to (?:fetch|download)[: ]|Request failed after \d+ retr)|"
                  r"error sending request for url \(https?://", re.M)),
    FetchTool("apt", _re(rf"{_W}apt(?:-get)? (?:-\S+ )*(?:install|update)\b"),
              _re(r"^(?:Err:\d+ https?://|[WE]: Failed to fetch |[WE]: Some index files failed)|"
                  r"Temporary failure resolving '", re.M)),
    FetchTool("curl", _re(rf"{_W}curl\b.*{_KEPT}"),
              _re(r"^curl: \((?:5|6|7|28|35|52|56)\) ", re.M)),
    FetchTool("wget", _re(rf"{_W}wget\s(?!.*--spider)(?!.*-O\s*/dev/null)"),
              _re(r"^wget: unable to resolve host address|^Resolving \S+ .*\.\.\. failed: |"
                  r"^Connecting to \S+ .*\.\.\. failed: ", re.M)),
    FetchTool("npm", _re(rf"{_W}(?:(?:npm|pnpm|yarn) (?:install|i|ci|add)\b|npx\s)"),
              _re(r"^npm (?:ERR!|error) (?:code )?(?:ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT|ENETUNREACH)\b|"
                  r"^npm (?:ERR!|error) network |ERR_PNPM_META_FETCH_FAIL|"
                  r"^error An unexpected error occurred: \"https?://registry", re.M)),
    FetchTool("git", _re(rf"{_W}git (?:clone|fetch|pull|submodule update)\b"),
              _re(r"^fatal: unable to access '[^']*': (?:Could not resolve host|Failed to connect|"
                  r"Could not connect)", re.M)),
    FetchTool("go", _re(rf"{_W}go (?:get|install|mod download|test|build|run)\b"),
              _re(r"dial tcp: lookup (?:proxy|sum)\.golang\.org|Get \"https://(?:proxy|sum)\.golang\.org")),
    FetchTool("cargo", _re(rf"{_W}cargo (?:install|build|test|fetch|run)\b"),
              _re(r"^(?:error|warning): (?:failed to (?:download|fetch|get|update|query replaced source)|"
                  r"spurious network error)", re.M)),
    FetchTool("gem", _re(rf"{_W}(?:gem|bundle) install\b"),
              _re(r"^ERROR:  Could not find a valid gem|Unable to download data from https?://|"
                  r"Could not fetch specs from", re.M)),
)

_NOT_FOUND = re.compile(r"^(?:.*?: )?(?:line \d+: )?([\w.+-]+): (?:command )?not found\s*$", re.M)
# What a test probes a URL with: their reports count only for a step of a known script.
_PROBES = {"curl", "wget"}
# Not found for its own reasons (harbor.diagnose says so apart): never a fetch's fault.
_NOT_FETCHED = {"python", "python3"}


# A test runner's own summary: the tests ran and were counted.
_REPORTED = re.compile(r"^=+ .*\b(?:passed|failed|errors?|skipped|xfailed|deselected)\b.* in [\d.]+m?s\b.*=+\s*$|"
                       r"^Ran \d+ tests? in [\d.]+s$", re.M)


def script_lines(script: str) -> list[str]:
    """The script's command lines (comments and blank lines left out)."""
    return [ln.strip() for ln in script.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def fetch_steps(script: str) -> list[tuple[int, str, str]]:
    """(line index, tool name, line) of every fetch step of ``script``, in order."""
    out = []
    for i, line in enumerate(script_lines(script)):
        for tool in TOOLS:
            if tool.step.search(line):
                out.append((i, tool.name, line))
                break
    return out


def _short(text: str, n: int = 100) -> str:
    text = text.strip()
    return text if len(text) <= n else text[: n - 3] + "..."


def fetch_failure(output: str, script: str | None = None, *, reported: bool = False) -> str:
    """What shows that a fetch step of ``script`` failed (module docstring: the rule),
    or '' when nothing does. ``reported``: the tests wrote their own report (a CTRF file)."""
    output = output or ""
    if reported or _REPORTED.search(output):
        return ""
    steps = fetch_steps(script) if script is not None else []
    step_tools = {name for _, name, _ in steps}
    for tool in TOOLS:
        if tool.name not in step_tools if script is not None else tool.name in _PROBES:
            continue
        m = tool.failed.search(output)
        if m:
            line = output[output.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0]
            ran = next((f"`{_short(s, 80)}`" for _, name, s in steps if name == tool.name), f"a {tool.name} fetch")
            return f"{ran} failed to download: {_short(line)}"
    if steps:
        lines = script_lines(script or "")
        for m in _NOT_FOUND.finditer(output):
            cmd = m.group(1)
            if cmd in _NOT_FETCHED:
                continue
            used = next((i for i, ln in enumerate(lines) if re.search(rf"{_W}{re.escape(cmd)}(?![\w.-])", ln)), None)
            before = [s for s in steps if used is not None and s[0] < used]
            if before:
                return (f"`{cmd}` was not found after the fetch step `{_short(before[-1][2], 80)}` "
                        "(it fetched nothing)")
    return ""
