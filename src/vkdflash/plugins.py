"""The plugin manager: loads the `vkdflash` entry-point group and the core's own hooks."""
from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points

import pluggy

from . import hookspecs
from .errors import VkdflashError

log = logging.getLogger("vkdflash")
GROUP = "vkdflash"
_manager: pluggy.PluginManager | None = None
_versions: dict[str, str | None] = {}


def allowed_plugins() -> set[str] | None:
    """VKDFLASH_PLUGINS=a,b loads only those entry points (empty: none); unset: all."""
    value = os.environ.get("VKDFLASH_PLUGINS")
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def manager() -> pluggy.PluginManager:
    global _manager
    if _manager is None:
        from .kv_cache import CoreCacheHooks
        pm = pluggy.PluginManager(GROUP)
        pm.add_hookspecs(hookspecs)
        pm.register(CoreCacheHooks, name="core")
        allowed = allowed_plugins()
        for ep in entry_points(group=GROUP):
            if allowed is not None and ep.name not in allowed:
                continue
            try:
                pm.register(ep.load(), name=ep.name)
                _versions[ep.name] = ep.dist.version if ep.dist else None
            except Exception as exc:  # a broken third-party plugin must not take the engine down
                log.warning("plugin %s failed to load and is skipped: %s: %s", ep.name, type(exc).__name__, exc)
        _manager = pm
    return _manager


def reset() -> None:
    """Forget the loaded plugins (the next manager() reloads, honouring VKDFLASH_PLUGINS)."""
    global _manager
    _manager = None
    _versions.clear()


def plugin_list() -> list[dict]:
    """name, version and implemented hooks of every loaded plugin (the core's own hooks excluded)."""
    pm = manager()
    out = []
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda item: item[0]):
        if name == "core":
            continue
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        out.append({"name": name, "version": _versions.get(name), "hooks": hooks})
    return out


def strategies() -> dict[str, tuple]:
    """name -> (factory, description, plugin name) for every registered strategy."""
    found: dict[str, tuple] = {}
    pm = manager()
    for impl in pm.hook.register_strategies.get_hookimpls():
        def register(name, factory, description="", _plugin=impl.plugin_name):
            if name in found:
                raise VkdflashError(f"strategy {name!r} registered twice (plugins {found[name][2]} and {_plugin})")
            found[name] = (factory, description, _plugin)
        try:
            impl.function(register=register)
        except VkdflashError:
            raise
        except Exception as exc:
            log.warning("plugin %s failed to register strategies: %s: %s", impl.plugin_name, type(exc).__name__, exc)
    return found
