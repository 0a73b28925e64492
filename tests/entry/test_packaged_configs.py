"""Configs ship in the package: a wheel built from the checkout carries conf/ as milo_ray/conf,
and a non-editable install composes every experiment from outside the checkout exactly as the
checkout does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from milo_ray.config.paths import checkout_conf_dir, conf_dir, packaged_conf_dir

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def _source_files() -> list[str]:
    """The files a user's checkout holds (tracked or new, not ignored): what `pip install .` sees."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built (no build isolation, no network) from an sdist of a copy of the checkout."""
    src = tmp_path_factory.mktemp("src") / "milo_ray"
    for rel in _source_files():
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((ROOT / rel).read_bytes())
    out = tmp_path_factory.mktemp("dist")
    # Through an sdist, as `python -m build` does: the sdist must carry conf/ (MANIFEST.in).
    proc = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(out)], cwd=src,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sdist,) = out.glob("milo_ray-*.tar.gz")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(out), str(sdist)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("milo_ray-*.whl")
    return whl


def test_the_wheel_carries_every_config_file_and_module_of_the_checkout(wheel):
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    packaged = {n.removeprefix("milo_ray/conf/") for n in names if n.startswith("milo_ray/conf/")}
    expected = {p.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml")}
    assert expected and packaged == expected
    assert not any(n.startswith("conf/") for n in names), "configs live inside the package, not at the top level"
    # Every module ships too, Hydra's plugin namespace (no __init__.py) included.
    modules = {f for f in _source_files() if f.endswith(".py") and f.split("/")[0] in ("milo_ray", "hydra_plugins")}
    assert modules - names == set()


def test_a_checkout_reads_its_own_conf_and_an_install_its_packaged_copy(tmp_path):
    assert Path(conf_dir()) == CONF == checkout_conf_dir()
    site = tmp_path / "site-packages"
    (site / "milo_ray" / "conf").mkdir(parents=True)
    (site / "milo_ray" / "conf" / "config.yaml").write_text("{}\n")
    (site / "conf").mkdir()  # another distribution's top-level conf/ is not ours
    (site / "conf" / "config.yaml").write_text("{}\n")
    assert checkout_conf_dir(site / "milo_ray") is None
    assert conf_dir(site / "milo_ray") == str(site / "milo_ray" / "conf") == str(packaged_conf_dir(site / "milo_ray"))
    (site / "milo_ray" / "conf" / "config.yaml").unlink()
    with pytest.raises(FileNotFoundError, match="setup.py"):
        conf_dir(site / "milo_ray")


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv (system site-packages for the dependencies, so nothing is downloaded) with
    the wheel installed non-editable (--ignore-installed: the system may hold an editable milo_ray
    that must not stand in for it); returns its python."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--ignore-installed",
                           "-q", str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return python


def _outside_env() -> dict[str, str]:
    # PYTHONPATH would put the checkout (or another tree) ahead of the installed package.
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _checkout_job_config(overrides: list[str]) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import milo_ray.run  # noqa: F401  (registers the structured configs and resolvers)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=overrides), resolve=False)


# ~10 s of CPU for the venv and the nine compositions (40 s on a loaded 2-core machine).
@pytest.mark.slow
@pytest.mark.parametrize("experiment", [None, *EXPERIMENTS])
def test_an_installed_wheel_composes_every_experiment_from_outside_the_checkout(installed, tmp_path, experiment):
    overrides = [] if experiment is None else [f"+experiment={experiment}"]
    where = subprocess.run([str(installed), "-c", "import milo_ray.run as r; print(r.__file__); print(r.CONF_DIR)"],
                           capture_output=True, text=True, cwd=tmp_path, env=_outside_env())
    assert where.returncode == 0, where.stderr[-3000:]
    module, conf = where.stdout.split()
    venv = installed.parent.parent
    assert Path(module).is_relative_to(venv) and Path(conf) == Path(module).parent / "conf"
    proc = subprocess.run([str(installed), "-m", "milo_ray.run", "--cfg", "job", *overrides],
                          capture_output=True, text=True, cwd=tmp_path, env=_outside_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert yaml.safe_load(proc.stdout) == _checkout_job_config(overrides)
    assert list(tmp_path.iterdir()) == [], "--cfg job writes nothing"
