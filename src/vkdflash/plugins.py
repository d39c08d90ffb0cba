"""The plugin manager: loads the `vkdflash` entry-point group, and calls the KV cache hooks
with every plugin's implementation isolated: one that raises (sys.exit() included; only Ctrl-C
gets through) or breaks its hook's contract is unregistered with one warning, and the call goes
on as if that plugin had never loaded."""
from __future__ import annotations

import difflib
import logging
import math
import os
from dataclasses import dataclass
from importlib.metadata import entry_points

import pluggy

from . import hookspecs
from .errors import VkdflashError
from .plugin_checks import declaration_problem, draft_problem, listed

log = logging.getLogger("vkdflash")
GROUP = "vkdflash"
CORE_DIST = "vkdflash"  # the distribution whose entry points are the built-in plugins
_manager: pluggy.PluginManager | None = None
_versions: dict[str, str | None] = {}
_builtin: set[str] = set()
_warned: set[str] = set()
HOOKS = sorted(name for name, spec in vars(hookspecs).items() if hasattr(spec, GROUP + "_spec"))
# what `--spec NAME` and `--spec-opt NAME.KEY=VALUE` can say, as the built-ins spell it (draft-dflash)


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
        # built-ins first: a third-party entry point of the same name cannot displace one
        installed = sorted(entry_points(group=GROUP), key=lambda ep: not _ships_with_core(ep))
        _warn_unknown(allowed, [ep.name for ep in installed])
        for ep in installed:
            if allowed is not None and ep.name not in allowed:
                continue
            try:
                pm.register(ep.load(), name=ep.name)
                _versions[ep.name] = ep.dist.version if ep.dist else None
                if _ships_with_core(ep):
                    _builtin.add(ep.name)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # a broken third-party plugin must not take the engine down
                log.warning("plugin %s failed to load and is skipped: %s", ep.name, _brief(exc))
                continue
            _warn_unspecified(pm, ep.name)
            for hook, impl in _impls(pm, ep.name):
                problem = _shape_problem(hook, impl)
                if problem:
                    pm.unregister(name=ep.name)
                    log.warning("plugin %s is skipped: %s", ep.name, problem)
                    break
        _manager = pm
    return _manager


def _warn_unspecified(pm, name: str) -> None:
    """A hook implementation that no hookspec names is never called: most likely a misspelling."""
    for caller in sorted(pm.get_hookcallers(pm.get_plugin(name)) or [], key=lambda c: c.name):
        mine = [impl for impl in caller.get_hookimpls() if impl.plugin_name == name]
        if caller.has_spec() or all(impl.optionalhook for impl in mine):
            continue
        near = difflib.get_close_matches(caller.name, HOOKS, n=1)
        log.warning("plugin %s implements %r, which is no vkdflash hook, so it is never called%s", name,
                    caller.name, f" (did you mean {near[0]}?)" if near else f" (the hooks: {', '.join(HOOKS)})")


def _ships_with_core(ep) -> bool:
    return ep.dist is not None and ep.dist.name == CORE_DIST


def _warn_unknown(allowed: set[str] | None, installed: list[str]) -> None:
    """A VKDFLASH_PLUGINS name that matches no installed plugin is most likely a typo: say so."""
    unknown = sorted((allowed or set()) - set(installed))
    if unknown:
        log.warning("VKDFLASH_PLUGINS names %s, which no installed plugin is called (installed: %s)",
                    ", ".join(map(repr, unknown)), ", ".join(sorted(installed)) or "none")


def _warn_once(message: str) -> None:
    """strategies() runs on every lookup: a problem it finds is said once, not once per lookup."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


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
    """The exception on one line (pluggy's validation errors span three)."""
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text[:300]}"


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
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
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
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
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
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            _evict(impl, f"its {hook} observer raised {_brief(exc)}")


def reset() -> None:
    """Forget the loaded plugins (the next manager() reloads, honouring VKDFLASH_PLUGINS)."""
    global _manager
    _manager = None
    _versions.clear()
    _builtin.clear()
    _warned.clear()


def plugin_list() -> list[dict]:
    """name, version and implemented hooks of every loaded plugin."""
    pm = manager()
    out = []
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda item: item[0]):
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        out.append({"name": name, "version": _versions.get(name), "hooks": hooks})
    return out


@dataclass(frozen=True)
class Registered:
    """A strategy as a plugin registered it."""
    name: str
    factory: object
    description: str
    plugin: str
    options: tuple = ()   # vkdflash.api.Option
    aliases: tuple = ()
    parts: tuple = ()     # a cascade's strategies (Registered), in the order they are asked

    def settings(self, pairs) -> dict:
        """Option values from `KEY=VALUE` texts (already stripped of "NAME."), defaults filled in."""
        known = {o.key: o for o in self.options}
        out = {o.key: o.default for o in self.options}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if key not in known:
                listed = ", ".join(known) or "none"
                raise VkdflashError(f"--spec-opt {self.name}.{pair[:40]}: {self.name} has no option "
                                    f"{key[:40]!r} (its options: {listed})")
            if not sep:
                raise VkdflashError(f"--spec-opt {self.name}.{key} needs a value: NAME.OPTION=VALUE")
            out[key] = known[key].parse(value, self.name)
            if isinstance(out[key], float) and not math.isfinite(out[key]):  # float() takes nan, inf and 1e999
                raise VkdflashError(f"--spec-opt {self.name}.{key}={value[:40]}: not a finite float")
        return out


def strategies() -> dict[str, Registered]:
    """name -> Registered for every registered strategy. One declared wrong (_declaration_problem) or
    under a name or alias already taken is refused with one warning, and the plugin's others still
    register; built-in plugins register first, so theirs are never displaced."""
    found: dict[str, Registered] = {}
    pm = manager()
    impls = sorted(pm.hook.register_strategies.get_hookimpls(),
                   key=lambda impl: (impl.plugin_name not in _builtin, impl.plugin_name))
    for impl in impls:
        def register(name, factory, description="", options=(), aliases=(), _plugin=impl.plugin_name):
            problem = declaration_problem(name, description, options, aliases) or _clash(name, aliases, found)
            if problem:
                _warn_once(f"plugin {_plugin}: its strategy {name!r:.40} is refused: {problem}")
                return
            found[name] = Registered(name, factory, description, _plugin, tuple(options), tuple(aliases))
        try:
            impl.function(register=register)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            _warn_once(f"plugin {impl.plugin_name} failed to register strategies: {_brief(exc)}")
    return found


def _clash(name: str, aliases, found: dict) -> str | None:
    owners = {"none": "the core"} | {n: f"plugin {r.plugin}" for r in found.values() for n in (r.name, *r.aliases)}
    taken = next((n for n in (name, *aliases) if n in owners), None)
    return None if taken is None else f"the name {taken!r:.40} is taken by {owners[taken]}"


def lookup(name: str) -> Registered:
    """The strategy registered under `name` or one of its aliases; a one-line error otherwise
    (spec.cascade.lookup reads cascades, `ngram+mtp`, too)."""
    found = strategies()
    for r in found.values():
        if name == r.name or name in r.aliases:
            return r
    raise VkdflashError(f"unknown speculative strategy {name[:40]!r}; available: {', '.join(['none', *sorted(found)])}")


def model_free() -> list[str]:
    """Built-in strategies that run no model: their proposals are free (Strategy.free_proposals:
    ngram's lookup of earlier text). Asking one costs next to nothing, so they lead the default
    cascade (cli_spec.SpecRequest.resolve_for)."""
    return sorted(n for n, r in strategies().items()
                  if r.plugin in _builtin and getattr(r.factory, "free_proposals", False) is True)


def draft_takers() -> list[str]:
    """The strategies a -md file can go to: those of the plugins that claim draft files."""
    claimers = {impl.plugin_name for impl in manager().hook.claim_draft_file.get_hookimpls()}
    return sorted(n for n, r in strategies().items() if r.plugin in claimers)


def _names_of(plugin: str, registered: dict) -> dict[str, str]:
    """Every name and alias of `plugin`'s own strategies -> its registered name."""
    return {n: r.name for r in registered.values() if r.plugin == plugin for n in (r.name, *r.aliases)}


def shipped(model_file) -> list:
    """Every draft a plugin ships for this target (shipped_drafts), best recorded tau first, its
    strategy spelled by its registered name. An entry the core cannot use is dropped with one
    warning naming its plugin; the plugin's other entries stay."""
    registered = strategies()
    found = []
    for impl in _well_shaped("shipped_drafts"):
        try:
            offered = _call(impl, {"model_file": model_file})
        except (VkdflashError, KeyboardInterrupt):  # a plugin's one-line verdict on the files, or Ctrl-C
            raise
        except BaseException as exc:
            _evict(impl, f"its shipped_drafts raised {_brief(exc)}")
            continue
        if offered is not None and not isinstance(offered, (list, tuple)):
            log.warning("plugin %s: its shipped_drafts returned a %s, not a list: ignored",
                        impl.plugin_name, type(offered).__name__)
            continue
        own = _names_of(impl.plugin_name, registered)
        for entry in offered or ():
            problem = draft_problem(entry, own)
            if problem:
                log.warning("plugin %s: shipped draft %.80r is dropped: %s", impl.plugin_name, entry, problem)
            else:
                found.append(dict(entry, strategy=own[entry["strategy"]]))
    return sorted(found, key=lambda d: -(d.get("tau") or 0.0))


def claim(path, metadata) -> str | None:
    """The strategy a plugin claims the draft file (its GGUF Metadata) for (claim_draft_file), or None.
    general.architecture, when present, is checked to be a string first: hooks compare it. A claim
    for a strategy the plugin did not register is ignored with one warning: the next plugin's counts."""
    metadata.str("general.architecture", default=None)
    registered = strategies()
    for impl in _well_shaped("claim_draft_file"):
        try:
            name = _call(impl, {"path": str(path), "metadata": metadata})
        except (VkdflashError, KeyboardInterrupt):
            raise
        except BaseException as exc:
            _evict(impl, f"its claim_draft_file raised {_brief(exc)}")
            continue
        own = _names_of(impl.plugin_name, registered)
        if isinstance(name, str) and name in own:
            return own[name]
        if name is not None:
            _warn_once(f"plugin {impl.plugin_name}: its claim_draft_file returned {name!r:.40}, not one of its "
                       f"strategies (its own: {listed(own)}): the claim is ignored")
    return None
