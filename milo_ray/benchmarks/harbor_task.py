"""One Harbor task directory: reading and validating ``task.toml``, ``instruction.md``,
``tests/``, ``solution/`` and the environment's Dockerfile.

Layout (Harbor / Terminal-Bench 2)::

    <task_id>/instruction.md      the prompt
              task.toml           [agent] [verifier] [environment] (+ [environment.env], [verifier.env], [solution.env])
              environment/        Dockerfile and the files it COPYs
              tests/test.sh       the verifier (writes /logs/verifier/reward.txt or reward.json)
              solution/solve.sh   optional reference solution

:func:`parse_task_dir` returns a :class:`HarborTaskSpec` and the list of problems found
(each one line naming the task, the field and the fix), so the loader can report a whole
broken suite at once. :func:`analyze_dockerfile` reads what a sandbox without Docker
must honour: WORKDIR, COPY/ADD of local files, ENV; anything that changes the system
(RUN, a multi-stage build, ADD of a URL, a non-root USER) makes the task need Docker.

Decisions where the format is loose:

* Versions: legacy ``version = "1.0"`` and ``schema_version = "1.x"``; either may be absent
  (read as 1.0); a major version other than 1 is refused.
* Timeouts: ``[agent] timeout_sec`` and ``[verifier] timeout_sec`` default to
  :data:`DEFAULT_TIMEOUT_S` (600 s) when absent.
* Memory/storage: ``memory_mb``/``storage_mb`` numbers, or the older ``memory``/``storage``
  strings ("2G", "512M", "1024" = MB).
* Network: ``allow_internet`` (bool) or ``network_mode`` ("none" = off, anything else on);
  a task that says neither gets no network -- our sandboxes are offline unless the task
  asks, so a task needing the network says so.
* Working directory: the Dockerfile's last WORKDIR, else ``[environment] workdir``, else ``/app``.
* ``${VAR}`` / ``${VAR:-default}`` templates in the ``env`` tables are kept as written (never
  their values: they may be keys) and resolved from the host environment only when a
  sandbox is built (:func:`resolve_env`); a referenced variable with no default that is
  unset at load time is a problem.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_WORKDIR = "/app"

_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SECRETISH = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)
# Instructions that only describe the image (metadata, entrypoints): nothing to honour
# for commands run inside an already-prepared workspace.
_INERT = {"LABEL", "MAINTAINER", "EXPOSE", "CMD", "ENTRYPOINT", "HEALTHCHECK", "STOPSIGNAL",
          "SHELL", "VOLUME", "ONBUILD"}


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name suggests a credential."""
    return bool(_SECRETISH.search(name))


def template_vars(value: str) -> list[tuple[str, str | None]]:
    """The ``(name, default)`` pairs a ``${VAR}`` / ``${VAR:-default}`` value references."""
    return [(m.group(1), m.group(2)) for m in _TEMPLATE.finditer(value)]


def resolve_env(templates: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """Substitute ``${VAR}`` templates from the host environment -- only the variables the
    task names; a missing one without a default raises ``ValueError`` naming it."""
    env = os.environ if environ is None else environ
    out = {}
    for key, value in templates.items():
        def sub(m: re.Match) -> str:
            name, default = m.group(1), m.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ValueError(f"env {key}: ${{{name}}} is not set in the host environment (export {name})")
        out[key] = _TEMPLATE.sub(sub, value)
    return out


@dataclass(frozen=True)
class DockerfileFacts:
    """What a sandbox that does not build the image must honour."""

    workdir: str | None = None
    copies: tuple[tuple[str, str], ...] = ()  # (host path, sandbox path); a dir maps to a dir
    env: dict[str, str] = field(default_factory=dict)
    base_image: str | None = None
    needs_docker: str | None = None
    problems: tuple[str, ...] = ()


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with comments dropped and ``\\`` continuations joined."""
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment lines inside a continuation are skipped by Docker too
        if not buf:
            start = i
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, (buf + line).strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def _subst(value: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: variables.get(m.group(1), m.group(0)), value)


def _copy_args(rest: str) -> tuple[list[str], list[str]]:
    """(flags, paths) of a COPY/ADD line, in shell or JSON form (flags come first)."""
    flags = []
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        flags.append(flag)
        rest = rest.lstrip()
    if rest.startswith("["):
        try:
            return flags, [str(x) for x in json.loads(rest)]
        except json.JSONDecodeError:
            pass
    return flags, shlex.split(rest)


def analyze_dockerfile(text: str, context: Path, *, where: str = "Dockerfile") -> DockerfileFacts:
    """Read a single-stage Dockerfile: WORKDIR (relative ones resolved against the previous;
    the last one wins), ENV/ARG (substituted into later paths), COPY/ADD of files under
    ``context`` (sandbox path resolved against the WORKDIR current at that line). The
    first instruction that changes the system becomes ``needs_docker``."""
    workdir: str | None = None
    env: dict[str, str] = {}
    args: dict[str, str] = {}
    copies: list[tuple[str, str]] = []
    problems: list[str] = []
    needs: list[str] = []
    base: str | None = None
    froms = 0
    for lineno, line in _logical_lines(text):
        instr, _, rest = line.partition(" ")
        instr, rest = instr.upper(), rest.strip()
        variables = {**args, **env}
        at = f"{where}:{lineno}"
        if instr == "FROM":
            froms += 1
            base = rest.split()[0] if rest else None
            if froms == 2:
                needs.append(f"{at}: a second FROM (multi-stage build)")
        elif instr == "WORKDIR":
            w = _subst(rest.strip("\"'"), variables)
            workdir = str(PurePosixPath(workdir or "/") / w) if not w.startswith("/") else w
        elif instr in ("ENV", "ARG"):
            target = env if instr == "ENV" else args
            try:
                tokens = shlex.split(rest)
            except ValueError:
                problems.append(f"{at}: cannot parse {instr} {rest!r}")
                continue
            if instr == "ENV" and tokens and "=" not in tokens[0]:  # legacy `ENV KEY value`
                target[tokens[0]] = _subst(rest[len(tokens[0]):].strip(), variables)
                continue
            for tok in tokens:
                k, eq, v = tok.partition("=")
                if eq or instr == "ENV":
                    target[k] = _subst(v, variables)
                else:
                    args.setdefault(k, "")
        elif instr in ("COPY", "ADD"):
            flags, paths = _copy_args(rest)
            if any(f.startswith("--from") for f in flags):
                needs.append(f"{at}: {instr} --from (copies from another image or stage)")
                continue
            if len(paths) < 2:
                problems.append(f"{at}: {instr} needs a source and a destination: {rest!r}")
                continue
            *srcs, dest = [_subst(p, variables) for p in paths]
            dest_abs = dest if dest.startswith("/") else str(PurePosixPath(workdir or "/") / dest)
            into_dir = dest.endswith("/") or len(srcs) > 1
            for src in srcs:
                if re.match(r"^[a-z]+://", src) or src.startswith("git@"):
                    needs.append(f"{at}: ADD of a URL ({src})")
                    continue
                matches = sorted(glob.glob(str(context / src))) if any(c in src for c in "*?[") else [str(context / src)]
                matches = [m for m in matches if Path(m).exists()]
                if not matches:
                    problems.append(f"{at}: {instr} source {src!r} does not exist under {context}")
                    continue
                for m in matches:
                    hp = Path(m).resolve()
                    if not hp.is_relative_to(context.resolve()):
                        problems.append(f"{at}: {instr} source {src!r} leaves the build context {context}")
                        continue
                    if instr == "ADD" and hp.is_file() and re.search(r"\.(tar|tgz|tar\.\w+)$", hp.name):
                        needs.append(f"{at}: ADD of a tar archive ({src}) is extracted by Docker")
                        continue
                    if hp.is_dir():  # Docker copies a directory's contents into dest
                        target = dest_abs
                    elif into_dir or len(matches) > 1:
                        target = str(PurePosixPath(dest_abs) / hp.name)
                    else:
                        target = dest_abs
                    copies.append((str(hp), target.rstrip("/") or "/"))
        elif instr == "RUN":
            snippet = rest if len(rest) <= 80 else rest[:77] + "..."
            needs.append(f"{at}: RUN {snippet}")
        elif instr == "USER":
            if rest.split(":")[0] not in ("root", "0"):
                needs.append(f"{at}: USER {rest} (commands must run as that user)")
        elif instr in _INERT:
            pass
        else:
            problems.append(f"{at}: unknown instruction {instr!r}")
    reason = None
    if needs:
        more = f" (and {len(needs) - 1} more)" if len(needs) > 1 else ""
        reason = f"{needs[0]}{more} changes the image; the host cannot stand in for it (use sandbox=docker)"
    return DockerfileFacts(workdir=workdir, copies=tuple(copies), env=env, base_image=base,
                           needs_docker=reason, problems=tuple(problems))


def parse_size_mb(value: Any) -> int:
    """``2048`` (MB), ``"2G"``, ``"512M"``, ``"1.5GB"``, ``"1024"`` -> MB; ``ValueError`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"{value!r} is not a positive size")
        return int(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(value), re.I)
    if not m:
        raise ValueError(f"{value!r} is not a size like 2048, '512M' or '2G'")
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    mb = int(float(m.group(1)) * scale)
    if mb <= 0:
        raise ValueError(f"{value!r} is not a positive size")
    return mb


@dataclass(frozen=True)
class HarborTaskSpec:
    """Everything the loader learned about one task directory (JSON-friendly)."""

    task_id: str
    task_dir: str
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    workdir: str
    allow_internet: bool
    cpus: float | None
    memory_mb: int | None
    storage_mb: int | None
    docker_image: str | None
    build_context: str | None
    copy_in: tuple[tuple[str, str], ...]
    dockerfile_env: dict[str, str]
    env_templates: dict[str, str]
    verifier_env_templates: dict[str, str]
    solution_env_templates: dict[str, str]
    needs_docker: str | None
    base_image: str | None
    has_solution: bool
    schema_version: str

    def metadata(self, files: Any = None) -> dict[str, Any]:
        """``Task.metadata``: templates, never resolved environment values.

        ``files``: the task directory packed for the nodes that run it (a
        :class:`~milo_ray.boundary.shipping.ShippedTree`). With it, ``copy_in`` and
        ``build_context`` name paths inside the task directory, resolved wherever the
        tree is unpacked; ``task_dir`` is then only where it was read (for messages).
        Without it they are absolute paths on this machine."""
        root = Path(self.task_dir)
        copy_in = [[_inside(root, h) if files is not None else h, s] for h, s in self.copy_in]
        context = self.build_context
        if files is not None and context is not None:
            context = _inside(root, context)
        return {
            "format": "harbor", "task_dir": self.task_dir, "files": files, "schema_version": self.schema_version,
            "agent_timeout_s": self.agent_timeout_s, "verifier_timeout_s": self.verifier_timeout_s,
            "workdir": self.workdir, "allow_internet": self.allow_internet, "cpus": self.cpus,
            "memory_mb": self.memory_mb, "storage_mb": self.storage_mb, "docker_image": self.docker_image,
            "build_context": context, "copy_in": copy_in,
            "dockerfile_env": dict(self.dockerfile_env), "env": dict(self.env_templates),
            "verifier_env": dict(self.verifier_env_templates), "solution_env": dict(self.solution_env_templates),
            "needs_docker": self.needs_docker, "base_image": self.base_image, "has_solution": self.has_solution,
            "host_note": (f"FROM {self.base_image} is approximated by the host system"
                          if self.base_image and not self.docker_image else None),
        }


def _inside(root: Path, path: str) -> str:
    """``path`` relative to the task directory ``root`` (every file a task's sandbox
    needs lies inside it: the loader refuses COPY sources outside the build context)."""
    return Path(path).relative_to(root).as_posix()


def _num(table: dict, key: str, where: str, report, *, default: float | None) -> float | None:
    v = table.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        report(f"{where} {key}={v!r}: must be a positive number")
        return default
    return float(v)


def _env_table(table: Any, where: str, report, environ: dict[str, str]) -> dict[str, str]:
    if table is None:
        return {}
    if not isinstance(table, dict):
        report(f"{where}: must be a table of NAME = \"value\"")
        return {}
    out: dict[str, str] = {}
    for k, v in table.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            report(f"{where}.{k}={v!r}: must be a string or number")
            continue
        out[str(k)] = str(v)
        for name, default in template_vars(str(v)):
            if default is None and name not in environ:
                report(f"{where}.{k} uses ${{{name}}}, which is not set in the host environment "
                                f"(export {name}, or write ${{{name}:-default}})")
    return out


def parse_task_dir(path: Path, environ: dict[str, str] | None = None) -> tuple[HarborTaskSpec, list[str]]:
    """Parse and validate one task directory: ``(spec, problems)``, each problem one line
    naming the task and the fix; the spec is only meant to be used when there are none."""
    environ = dict(os.environ) if environ is None else environ
    d = Path(path).resolve()
    tid = d.name
    problems: list[str] = []

    def p(msg: str) -> None:
        problems.append(f"task {tid}: {msg}")

    instruction = ""
    ins = d / "instruction.md"
    if not ins.is_file():
        p("instruction.md is missing (write the task's prompt there)")
    else:
        instruction = ins.read_text(errors="replace")
        if not instruction.strip():
            p("instruction.md is empty (write the task's prompt there)")
    if not (d / "tests" / "test.sh").is_file():
        p("tests/test.sh is missing (the verifier entry point that writes /logs/verifier/reward.txt)")
    cfg: dict[str, Any] = {}
    toml_path = d / "task.toml"
    if not toml_path.is_file():
        p("task.toml is missing (at least `version = \"1.0\"`)")
    else:
        try:
            cfg = tomllib.loads(toml_path.read_text())
        except tomllib.TOMLDecodeError as e:
            p(f"task.toml does not parse ({e}); fix its TOML syntax")
    version = str(cfg.get("schema_version", cfg.get("version", "1.0")))
    if not re.fullmatch(r"1(\.\d+)*", version):
        p(f"task.toml version {version!r} is not supported (this loader reads 1.x: `version = \"1.0\"` or "
          "`schema_version = \"1.1\"`..)")
    tables = {}
    for name in ("agent", "verifier", "environment", "solution", "metadata"):
        t = cfg.get(name, {})
        if not isinstance(t, dict):
            p(f"task.toml [{name}] must be a table")
            t = {}
        tables[name] = t
    agent_t = _num(tables["agent"], "timeout_sec", "task.toml [agent]", p, default=DEFAULT_TIMEOUT_S)
    verifier_t = _num(tables["verifier"], "timeout_sec", "task.toml [verifier]", p, default=DEFAULT_TIMEOUT_S)
    env_t = tables["environment"]
    cpus = _num(env_t, "cpus", "task.toml [environment]", p, default=None)
    sizes: dict[str, int | None] = {}
    for key, legacy in (("memory_mb", "memory"), ("storage_mb", "storage")):
        raw = env_t.get(key, env_t.get(legacy))
        sizes[key] = None
        if raw is not None:
            try:
                sizes[key] = parse_size_mb(raw)
            except ValueError as e:
                p(f"task.toml [environment] {key if key in env_t else legacy}: {e}")
    allow = env_t.get("allow_internet")
    if allow is not None and not isinstance(allow, bool):
        p(f"task.toml [environment] allow_internet={allow!r}: must be true or false")
        allow = None
    mode = env_t.get("network_mode")
    if allow is None and mode is not None:
        allow = str(mode).lower() != "none"
    image = env_t.get("docker_image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        p(f"task.toml [environment] docker_image={image!r}: must be an image reference string")
        image = None
    toml_workdir = env_t.get("workdir")
    if toml_workdir is not None and (not isinstance(toml_workdir, str) or not toml_workdir.startswith("/")):
        p(f"task.toml [environment] workdir={toml_workdir!r}: must be an absolute path")
        toml_workdir = None
    where = "task.toml [{}.env]"
    env_templates = _env_table(env_t.get("env"), where.format("environment"), p, environ)
    verifier_env = _env_table(tables["verifier"].get("env"), where.format("verifier"), p, environ)
    solution_env = _env_table(tables["solution"].get("env"), where.format("solution"), p, environ)

    envdir = d / "environment"
    dockerfile = envdir / "Dockerfile"
    facts = DockerfileFacts()
    if dockerfile.is_file():
        facts = analyze_dockerfile(dockerfile.read_text(errors="replace"), envdir, where="environment/Dockerfile")
        problems.extend(f"task {tid}: {q}" for q in facts.problems)
    elif image is None:
        p("neither environment/Dockerfile nor [environment] docker_image is given (add a Dockerfile, "
          "even just `FROM ubuntu:24.04` + `WORKDIR /app`)")
    needs = facts.needs_docker
    if not dockerfile.is_file() and image:
        needs = f"uses the prebuilt image {image} with no Dockerfile to read; the host cannot stand in for it"
    workdir = facts.workdir or toml_workdir or DEFAULT_WORKDIR
    sol = d / "solution" / "solve.sh"
    spec = HarborTaskSpec(
        task_id=tid, task_dir=str(d), instruction=instruction,
        agent_timeout_s=float(agent_t or DEFAULT_TIMEOUT_S), verifier_timeout_s=float(verifier_t or DEFAULT_TIMEOUT_S),
        workdir=workdir, allow_internet=bool(allow), cpus=cpus,
        memory_mb=sizes["memory_mb"], storage_mb=sizes["storage_mb"], docker_image=image,
        build_context=str(envdir) if dockerfile.is_file() else None, copy_in=facts.copies,
        dockerfile_env=dict(facts.env), env_templates=env_templates, verifier_env_templates=verifier_env,
        solution_env_templates=solution_env, needs_docker=needs, base_image=facts.base_image,
        has_solution=sol.is_file(), schema_version=version)
    return spec, problems
