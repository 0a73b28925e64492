"""cluster.yaml (AWS) and cluster.local.yaml (on-premises) are accepted by the installed Ray's own
`ray up` config path, start Ray with the intended slots once a shell has read their quoting,
install the pinned Ray, CPU torch and the project, and hold no secret."""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_FILES = ["cluster.yaml", "cluster.local.yaml"]
UBUNTU_2404_PARAMETER = "resolve:ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
# vCPUs of the EC2 instance types the file may use (a worker offers one sandbox_slot per vCPU).
VCPUS = {"m6i.large": 2, "m6i.xlarge": 4, "m6i.2xlarge": 8, "m6i.4xlarge": 16, "m6i.8xlarge": 32,
         "c6i.4xlarge": 16, "c6i.8xlarge": 32, "m7i.4xlarge": 16}
HEAD_DRIVER_SLOTS = 8


def _load(name: str) -> dict:
    # Exactly how `ray up` reads it (commands.create_or_update_cluster).
    return yaml.safe_load((ROOT / name).read_text())


def _ray_up_config_path(config: dict, monkeypatch) -> dict:
    """`ray up`'s config handling up to launching the head (commands._bootstrap_config: Ray's
    defaults merged by prepare_config, the provider's resource fill-out, validate_config, the
    provider's bootstrap), with the two steps that call the AWS API stubbed out."""
    from ray.autoscaler._private import commands
    from ray.autoscaler._private.providers import _NODE_PROVIDERS

    importer = _NODE_PROVIDERS.get(config["provider"]["type"])
    assert importer is not None, f"ray up knows no provider {config['provider']['type']!r}"
    provider_cls = importer(config["provider"])
    if config["provider"]["type"] == "aws":
        monkeypatch.setattr(provider_cls, "fillout_available_node_types_resources", staticmethod(lambda c: c))
        monkeypatch.setattr(provider_cls, "bootstrap_config", staticmethod(lambda c: c))
    return commands._bootstrap_config(copy.deepcopy(config), no_config_cache=True)


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_ray_up_accepts_the_cluster_file(name, monkeypatch):
    resolved = _ray_up_config_path(_load(name), monkeypatch)
    head_start = resolved["head_start_ray_commands"]
    # commands.warn_about_bad_start_command: without these the head starts no Ray or no autoscaler.
    assert any("ray start" in c for c in head_start)
    assert any("--autoscaling-config=~/ray_bootstrap_config.yaml" in c for c in head_start)


# moto's IAM waits are stubbed, but importing it and the managed policies still take ~20 s.
@pytest.mark.slow
def test_ray_up_bootstraps_the_aws_cluster_against_a_mocked_aws(monkeypatch, tmp_path):
    """The whole of `ray up`'s config path, AWS calls included, against moto's fake AWS: the
    node types' resources filled out from EC2's instance types, the instance role on the head
    only, a key pair, subnets and a security group."""
    import moto
    from ray.autoscaler._private import commands
    from ray.autoscaler._private.aws import config as aws_config

    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")  # AmazonEC2FullAccess etc.
    monkeypatch.setenv("HOME", str(tmp_path))  # the key pair's .pem is written to ~/.ssh
    monkeypatch.setattr(aws_config, "time", type("NoWait", (), {"sleep": staticmethod(lambda _s: None)}))
    with moto.mock_aws():
        resolved = commands._bootstrap_config(_load("cluster.yaml"), no_config_cache=True)
    types = resolved["available_node_types"]
    head = types[resolved["head_node_type"]]
    assert head["resources"]["sandbox_slot"] == 0
    for name, node_type in types.items():
        if name != resolved["head_node_type"]:
            assert node_type["resources"]["sandbox_slot"] == node_type["resources"]["CPU"], "one slot per vCPU"
            assert "IamInstanceProfile" not in node_type["node_config"], "workers hold no instance role"
        assert node_type["node_config"]["KeyName"] and node_type["node_config"]["SecurityGroupIds"]
    assert resolved["head_node"]["IamInstanceProfile"]["Arn"].endswith("/ray-autoscaler-v1")
    assert Path(resolved["auth"]["ssh_private_key"]).is_relative_to(tmp_path)


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_an_unquoted_resources_flag_is_refused_by_the_same_validation(name, monkeypatch):
    """The guard can fail: `--resources='{"sandbox_slot": 8}'` as a plain YAML scalar is a mapping."""
    import jsonschema

    broken = (ROOT / name).read_text() + "\nworker_start_ray_commands:\n  - ray start --resources='{\"sandbox_slot\": 8}'\n"
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'string'"):
        _ray_up_config_path(yaml.safe_load(broken), monkeypatch)


def test_aws_default_boots_python_312_with_no_slots_on_the_head_and_one_per_vcpu_on_workers():
    config = _load("cluster.yaml")
    assert config["provider"]["type"] == "aws"
    types = config["available_node_types"]
    for node_type in types.values():
        assert node_type["node_config"]["ImageId"] == UBUNTU_2404_PARAMETER  # Ubuntu 24.04: python3 is 3.12
    head = types[config["head_node_type"]]
    assert head["resources"] == {"sandbox_slot": 0, "driver_slot": HEAD_DRIVER_SLOTS}
    workers = [t for name, t in types.items() if name != config["head_node_type"]]
    assert workers
    for worker in workers:
        assert worker["min_workers"] == 0, "workers scale up from 0 on sandbox_slot demand"
        assert worker["resources"] == {"sandbox_slot": VCPUS[worker["node_config"]["InstanceType"]]}


def _fake_tools(tmp_path: Path) -> tuple[Path, Path]:
    """A `ray` that records its arguments (and whether it sees a provider key) instead of
    starting anything, and an `sg` that runs its command as the real one does (`sh -c`)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "ray_calls.jsonl"
    bin_dir.mkdir(parents=True)
    (bin_dir / "ray").write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        with open({str(calls)!r}, "a") as f:
            f.write(json.dumps({{"argv": sys.argv[1:], "sees_key": "MILO_TEST_PROVIDER_KEY" in os.environ,
                                "groups_via_sg": os.environ.get("FAKE_SG_GROUP")}}) + "\\n")
        """))
    (bin_dir / "sg").write_text('#!/bin/sh\n[ "$2" = "-c" ] || exit 64\nFAKE_SG_GROUP="$1" exec /bin/sh -c "$3"\n')
    for tool in ("ray", "sg"):
        (bin_dir / tool).chmod((bin_dir / tool).stat().st_mode | stat.S_IEXEC)
    return bin_dir, calls


def _run_start_commands(commands: list[str], tmp_path: Path, node_resources: dict | None) -> list[dict]:
    """Run start commands through a shell as the updater does: each one separately, with
    RAY_HEAD_IP (autoscaler.with_head_node_ip) and RAY_OVERRIDE_RESOURCES exported
    (command_runner._with_environment_variables) and Ray's interactive wrapper."""
    from ray.autoscaler._private.command_runner import _with_environment_variables
    from ray.autoscaler._private.util import with_head_node_ip

    bin_dir, calls = _fake_tools(tmp_path)
    home = tmp_path / "home"
    (home / ".milo_ray").mkdir(parents=True, exist_ok=True)
    (home / ".milo_ray" / "keys.env").write_text("MILO_TEST_PROVIDER_KEY=not-a-real-key\n")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(home)}
    for cmd in with_head_node_ip(commands, "10.0.0.1"):
        assert isinstance(cmd, str)
        env_vars = {"RAY_OVERRIDE_RESOURCES": node_resources} if node_resources else {}
        wrapped = f"export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore && ({_with_environment_variables(cmd, env_vars)})"
        proc = subprocess.run(["bash", "-c", wrapped], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    lines = calls.read_text().splitlines()
    return [json.loads(line) for line in lines]


def _start_call(calls: list[dict]) -> dict:
    (start,) = [c for c in calls if c["argv"][:1] == ["start"]]
    return start


def _resources_flag(argv: list[str]) -> dict:
    (flag,) = [a for a in argv if a.startswith("--resources=")]
    return json.loads(flag.removeprefix("--resources="))


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_start_commands_give_the_shell_the_intended_slots(name, tmp_path):
    config = _load(name)
    aws = config["provider"]["type"] == "aws"
    types = config.get("available_node_types", {})
    head_resources = types[config["head_node_type"]]["resources"] if aws else None
    head = _start_call(_run_start_commands(config["head_start_ray_commands"], tmp_path / "head", head_resources))
    assert "--head" in head["argv"]
    assert _resources_flag(head["argv"]) == {"sandbox_slot": 0, "driver_slot": HEAD_DRIVER_SLOTS}
    assert head["sees_key"], "the head's Ray (and so the drivers Ray Jobs start) gets ~/.milo_ray/keys.env"

    if aws:
        (worker_type,) = [t for n, t in types.items() if n != config["head_node_type"]]
        expected_slots = worker_type["resources"]["sandbox_slot"]
    else:
        expected_slots = os.cpu_count()  # the machine's online CPUs
    worker_resources = worker_type["resources"] if aws else None
    worker = _start_call(_run_start_commands(config["worker_start_ray_commands"], tmp_path / "worker", worker_resources))
    assert "--address=10.0.0.1:6379" in worker["argv"]
    assert _resources_flag(worker["argv"]) == {"sandbox_slot": expected_slots}
    assert worker["groups_via_sg"] == "docker", "workers' Ray runs with the docker group"
    assert not worker["sees_key"], "worker nodes never hold a provider key"


def _pyproject_ray_pin() -> str:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray_dep,) = [d for d in deps if d.startswith("ray[")]
    match = re.fullmatch(r"ray\[default\]==(\d+\.\d+\.\d+)", ray_dep)
    assert match, f"pyproject pins Ray exactly (got {ray_dep!r})"
    return match.group(1)


def test_the_project_pins_the_installed_ray():
    import ray

    assert _pyproject_ray_pin() == ray.__version__


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_setup_installs_cpu_torch_then_the_pinned_ray_then_the_mounted_checkout(name):
    config = _load(name)
    setup = config["setup_commands"]
    joined = "\n".join(setup)
    pins = re.findall(r"ray\[default\]==([\w.]+)", joined)
    assert pins and set(pins) == {_pyproject_ray_pin()}, "the nodes run the driver's Ray"
    pip = [i for i, c in enumerate(setup) if "pip install" in c]
    torch = [i for i in pip if re.search(r"\btorch==", setup[i])]
    assert torch and torch[0] == pip[0], "CPU torch first, before anything that pulls the CUDA build"
    assert "--index-url https://download.pytorch.org/whl/cpu" in setup[torch[0]]
    assert config["file_mounts"].get("~/milo_ray") == ".", "ray up ships the checkout it is run from"
    assert any(re.search(r"pip install( -q)? ~/milo_ray\b", c) for c in setup), "the mounted checkout is installed"
    assert re.search(r"apt-get install[^\n]*\bbubblewrap\b", joined)
    workers = "\n".join(config["worker_setup_commands"])
    assert "docker.io" in workers and "usermod -aG docker" in workers
    assert "docker.io" not in "\n".join(config.get("head_setup_commands", [])), "the head runs no sandbox"


# A literal credential: provider API keys, AWS access keys and secrets, private key blocks,
# tokens assigned in the file.
_SECRET = re.compile(
    r"sk-[A-Za-z0-9_-]{16,}|\b(AKIA|ASIA)[A-Z0-9]{16}\b|-----BEGIN [A-Z ]*PRIVATE KEY-----|"
    r"\b(aws_secret_access_key|aws_session_token|api_key|apikey|secret|password|token)\b\s*[:=]\s*\S+|"
    r"\b[A-Z][A-Z0-9_]*(_KEY|_TOKEN|_SECRET)=\S+", re.IGNORECASE)


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_no_key_is_written_in_the_cluster_file(name):
    text = (ROOT / name).read_text()
    assert not [m.group(0) for m in _SECRET.finditer(text)]
    assert "aws_credentials" not in _load(name)["provider"], "ray up takes AWS credentials from the environment"


def test_the_secret_pattern_catches_keys():
    for leak in ["  aws_secret_access_key: wJalrXUtnFEMI/K7MDENG", "export OPENAI_API_KEY=sk-abcdefghijklmnopqrstu",
                 "AKIAIOSFODNN7EXAMPLE", "-----BEGIN OPENSSH PRIVATE KEY-----", "ANTHROPIC_API_KEY=abc"]:
        assert _SECRET.search(leak), leak
