"""The method registry: every search method's :class:`~milo_ray.search.plugin.MethodPlugin`
by the name the manifest records (``method_name``).

The entry point runs a method through its plugin; the results API, the report and the
live status find a run's plugin here and ask it, so none of them knows a method by its
class, config keys or event kinds. The packaged methods (``milo``, ``ssr``, ``eval``) are
imported on first use, one at a time, so reading an SSR run never imports MILO's modules
(and nothing imports Ray to read a run). Any other method registers its plugin with
:func:`register` when its package is imported.

A run whose method has no plugin here still reads: :data:`UNKNOWN` gives no figures and
no status lines, and takes its final test from the summary's ``final_test`` rows.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Mapping

from milo_ray.search.plugin import MethodPlugin

__all__ = ["register", "unregister", "plugin_named", "plugin_for_manifest", "plugin_for_method",
           "plugin_owning_event", "UNKNOWN"]

# The packaged plugins: name -> the module whose ``PLUGIN`` it is. A table of modules (not
# of imported objects) so each is imported only when a run of it is read or started.
_PACKAGED = {"milo": "milo_ray.milo.plugin", "ssr": "milo_ray.ssr.plugin", "eval": "milo_ray.evaluation_plugin"}

_registry: dict[str, MethodPlugin] = {}
_lock = threading.Lock()


class _Unknown(MethodPlugin):
    """A method no plugin is registered for: its summary's rows, nothing else."""

    name = "unknown"


UNKNOWN: MethodPlugin = _Unknown()


def register(plugin: MethodPlugin) -> MethodPlugin:
    """Add ``plugin`` under ``plugin.name`` (a packaged name cannot be taken over)."""
    name = str(plugin.name or "")
    if not name or name == UNKNOWN.name:
        raise ValueError(f"method plugin {type(plugin).__name__}: give it a name (not {name!r})")
    with _lock:
        held = _registry.get(name)
        if held is not None and held is not plugin:
            raise ValueError(f"method plugin {name!r} is registered already ({type(held).__name__})")
        if held is None and name in _PACKAGED and type(plugin).__module__ != _PACKAGED[name]:
            raise ValueError(f"method name {name!r} is a packaged method's; choose another name")
        _registry[name] = plugin
    return plugin


def unregister(name: str) -> None:
    """Remove a registered plugin (tests register toy methods and remove them)."""
    with _lock:
        _registry.pop(name, None)


def plugin_named(name: str) -> MethodPlugin | None:
    """The plugin of method ``name`` (a packaged one is imported now), None if there is none."""
    with _lock:
        found = _registry.get(name)
    if found is not None or name not in _PACKAGED:
        return found
    return register(importlib.import_module(_PACKAGED[name]).PLUGIN)


def _all() -> list[MethodPlugin]:
    for name in _PACKAGED:
        plugin_named(name)
    with _lock:
        return list(_registry.values())


def plugin_for_manifest(manifest: Mapping[str, Any]) -> MethodPlugin:
    """The plugin of a stored run: by its ``method_name``; for a run written before that
    was recorded, by its summary's ``method``, then by the plugin that recognizes the
    manifest's ``method`` target; :data:`UNKNOWN` when none does."""
    for key in (manifest.get("method_name"), (manifest.get("summary") or {}).get("method")):
        if key:
            found = plugin_named(str(key))
            if found is not None:
                return found
    return next((p for p in _all() if p.recognizes(manifest)), UNKNOWN)


def plugin_for_method(method: Any) -> MethodPlugin:
    """The plugin of a built method object (by its ``name``); ``LookupError`` naming the
    registered methods when it has none."""
    name = str(getattr(method, "name", "") or "")
    found = plugin_named(name) if name else None
    if found is None:
        known = ", ".join(sorted({*_PACKAGED, *_registry}))
        raise LookupError(f"method {type(method).__module__}.{type(method).__qualname__} (name {name!r}) has no "
                          f"method plugin; register one with milo_ray.methods.register (registered: {known})")
    return found


def plugin_owning_event(kind: str) -> MethodPlugin | None:
    """The plugin whose events include ``kind`` (None: no method's, e.g. a run-level record)."""
    return next((p for p in _all() if p.owns_event(kind)), None)
