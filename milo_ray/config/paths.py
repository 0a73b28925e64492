"""Where the Hydra configs are: the repository's ``conf/`` in a checkout, the packaged copy
(``milo_ray/conf``) in an installed wheel.

``conf/`` stays at the repository's top level, where users edit it; the wheel build
(``setup.py``) copies it into the package so a non-editable install -- on a cluster node,
in a Ray job's runtime environment -- composes the same runs. A checkout is recognised by
``pyproject.toml`` next to the package, so a stray ``conf/`` directory beside an installed
package in ``site-packages`` is never mistaken for ours.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # milo_ray/
PRIMARY_CONFIG = "config.yaml"


def checkout_conf_dir(package_dir: Path = _PACKAGE_DIR) -> Path | None:
    """``<repo>/conf`` when ``package_dir`` sits in a source checkout, else None."""
    root = package_dir.parent
    conf = root / "conf"
    if (root / "pyproject.toml").is_file() and (conf / PRIMARY_CONFIG).is_file():
        return conf
    return None


def packaged_conf_dir(package_dir: Path = _PACKAGE_DIR) -> Path | None:
    """``milo_ray/conf`` when the package was installed from a built wheel, else None."""
    conf = package_dir / "conf"
    return conf if (conf / PRIMARY_CONFIG).is_file() else None


def conf_dir(package_dir: Path = _PACKAGE_DIR) -> str:
    """The directory every entry point composes from (the checkout's wins: it is the one
    being edited)."""
    found = checkout_conf_dir(package_dir) or packaged_conf_dir(package_dir)
    if found is None:
        raise FileNotFoundError(
            f"no Hydra configs found: neither {package_dir.parent / 'conf'} (a source checkout) nor "
            f"{package_dir / 'conf'} (an installed wheel) has {PRIMARY_CONFIG}; reinstall milo_ray from a "
            "wheel built by its setup.py (pip install <checkout>), which copies conf/ into the package")
    return str(found)


def config_groups(conf_dir: str) -> dict[str, list[str]]:
    """Every config group (``conf/`` directories and the ConfigStore's groups) -> its
    selectable options (YAML files and stored nodes; schemas, ``*_schema``, excluded)."""
    from hydra.core.config_store import ConfigStore

    groups: dict[str, set[str]] = {}
    for folder in sorted(Path(conf_dir).iterdir()):
        if folder.is_dir() and not folder.name.startswith((".", "_")):
            groups[folder.name] = {p.stem for p in folder.glob("*.yaml")}
    for name, node in ConfigStore.instance().repo.items():
        if isinstance(node, dict) and name != "hydra":
            groups.setdefault(name, set()).update(
                n.removesuffix(".yaml") for n in node if not n.removesuffix(".yaml").endswith("_schema"))
    return {g: sorted(o) for g, o in groups.items()}
