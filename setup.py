"""Build hook: ship the repository's top-level ``conf/`` inside the wheel as ``milo_ray/conf``.

Everything else about the package is declared in pyproject.toml. ``conf/`` is not under the
package directory (users know it at the top level), so package-data patterns cannot reach it;
this copies it into the build tree, where the wheel picks it up, and milo_ray.config.paths finds
it in an installed package. Editable installs skip the copy: they read the checkout's conf/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CONF = ROOT / "conf"


class build_py_with_conf(build_py):
    """``build_py`` that also copies ``conf/**/*.yaml`` to ``<build_lib>/milo_ray/conf``."""

    def _conf_files(self) -> list[Path]:
        if not (CONF / "config.yaml").is_file():
            # An sdist built without MANIFEST.in's conf/ line would give a wheel that
            # cannot compose a run: refuse instead.
            raise RuntimeError(f"{CONF / 'config.yaml'} is missing: the wheel would ship no configs "
                               "(an sdist needs MANIFEST.in's `graft conf`)")
        return sorted(p for p in CONF.rglob("*.yaml") if p.is_file())

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "milo_ray" / "conf"
        if target.exists():
            shutil.rmtree(target)  # a stale build/ must not keep deleted configs
        for src in self._conf_files():
            dest = target / src.relative_to(CONF)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            target = Path(self.build_lib) / "milo_ray" / "conf"
            outputs += [str(target / p.relative_to(CONF)) for p in self._conf_files()]
        return outputs


setup(cmdclass={"build_py": build_py_with_conf})
