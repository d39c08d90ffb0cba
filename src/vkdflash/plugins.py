"""The plugin manager: loads the `vkdflash` entry-point group, and calls the KV cache hooks
with every plugin's implementation isolated: one that raises or breaks its hook's contract is
unregistered with one warning, and the call goes on as if that plugin had never loaded."""
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
        pm = pluggy.PluginManager(GROUP)
        pm.add_hookspecs(hookspecs)
        allowed = allowed_plugins()
        for ep in entry_points(group=GROUP):
            if allowed is not None and ep.name not in allowed:
                continue
            try:
                pm.register(ep.load(), name=ep.name)
                _versions[ep.name] = ep.dist.version if ep.dist else None
            except Exception as exc:  # a broken third-party plugin must not take the engine down
                log.warning("plugin %s failed to load and is skipped: %s: %s", ep.name, type(exc).__name__, exc)
                continue
            for hook, impl in _impls(pm, ep.name):
                problem = _shape_problem(hook, impl)
                if problem:
                    pm.unregister(name=ep.name)
                    log.warning("plugin %s is skipped: %s", ep.name, problem)
                    break
        _manager = pm
    return _manager


# The cache hooks and the one shape each plugin implementation of them may take.
_SHAPES = {"kv_cache_write": "wrapper", "kv_cache_written": "plain"}


def _impls(pm, plugin_name: str) -> list:
    return [(name, impl) for name in _SHAPES for impl in getattr(pm.hook, name).get_hookimpls()
            if impl.plugin_name == plugin_name]


def _shape_problem(name: str, impl) -> str | None:
    if _SHAPES.get(name) == "wrapper" and not impl.wrapper:
        return (f"its {name} is not a wrapper: the core stores every write, plugins only observe it "
                "(use @hookimpl(wrapper=True) and `return (yield)`)")
    if _SHAPES.get(name) == "plain" and (impl.wrapper or impl.hookwrapper):
        return f"its {name} is a wrapper: it is an observer, implement it as a plain function"
    return None


def _evict(impl, why: str) -> None:
    pm = manager()
    if pm.get_plugin(impl.plugin_name) is not None:
        pm.unregister(name=impl.plugin_name)
        log.warning("plugin %s is unregistered: %s; the run goes on without it", impl.plugin_name, why)


def _brief(exc: BaseException) -> str:
    text = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text[:200]}"


def _call(impl, kwargs: dict):
    args = [kwargs[a] for a in impl.argnames]
    return impl.function(*args, **{a: kwargs[a] for a in impl.kwargnames if a in kwargs})


def _well_shaped(hook: str) -> list:
    """The plugin implementations of `hook` in pluggy's call order; one of the wrong shape (see
    _SHAPES) is unregistered with one warning instead."""
    out = []
    for impl in reversed(getattr(manager().hook, hook).get_hookimpls()):
        problem = _shape_problem(hook, impl)
        if problem:
            _evict(impl, problem)
        else:
            out.append(impl)
    return out


def wrap(hook: str, kwargs: dict, core) -> None:
    """Run core() inside every plugin wrapper of `hook`, in pluggy's order. core() runs whatever
    the wrappers do; a wrapper that raises, does not yield exactly once, or is not a wrapper
    is unregistered with one warning."""
    running = []
    for impl in _well_shaped(hook):
        try:
            gen = _call(impl, kwargs)
            next(gen)
            running.append((impl, gen))
        except StopIteration:
            _evict(impl, f"its {hook} wrapper returned without yielding")
        except Exception as exc:
            _evict(impl, f"its {hook} wrapper raised {_brief(exc)}")
    try:
        core()
    except BaseException:
        for _, gen in running:
            gen.close()
        raise
    for impl, gen in reversed(running):
        try:
            gen.send(None)
        except StopIteration:
            continue
        except Exception as exc:
            _evict(impl, f"its {hook} wrapper raised {_brief(exc)} after the write")
            continue
        gen.close()
        _evict(impl, f"its {hook} wrapper yielded more than once")


def observed(hook: str) -> bool:
    return bool(getattr(manager().hook, hook).get_hookimpls())


def notify(hook: str, **kwargs) -> None:
    """Call every plugin's `hook` observer; one that raises is unregistered with one warning."""
    for impl in _well_shaped(hook):
        try:
            _call(impl, kwargs)
        except Exception as exc:
            _evict(impl, f"its {hook} observer raised {_brief(exc)}")


def reset() -> None:
    """Forget the loaded plugins (the next manager() reloads, honouring VKDFLASH_PLUGINS)."""
    global _manager
    _manager = None
    _versions.clear()


def plugin_list() -> list[dict]:
    """name, version and implemented hooks of every loaded plugin."""
    pm = manager()
    out = []
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda item: item[0]):
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
