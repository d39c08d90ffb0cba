"""Hook specifications: everything a vkdflash plugin can implement.

Plugins register through the `vkdflash` entry-point group (built-in ones in plugins/ exactly
like third-party ones); VKDFLASH_PLUGINS=name,name restricts which load. Implement hooks with
`@vkdflash.hookimpl`; an implementation named after no hook here is never called, and is warned
about with the nearest hook's name. A plugin that raises anything, sys.exit() included, loses
only itself (one warning); Ctrl-C still stops the run."""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("vkdflash")
hookimpl = pluggy.HookimplMarker("vkdflash")


@hookspec
def register_strategies(register) -> None:
    """Register speculative strategies.

    Call `register(name, factory, description="", options=(), aliases=())` once per strategy,
    where `factory(ctx: vkdflash.api.StrategyContext) -> vkdflash.api.Strategy` builds one for a
    generation request. `name` is what `--spec NAME` selects; `aliases` are other spellings
    (llama.cpp's `--spec-type draft-dflash`); `options` are `vkdflash.api.Option`s, set with
    `--spec-opt NAME.KEY=VALUE` and read from `ctx.options.settings`. Names, aliases and option
    keys are lowercase letters, digits, '-' and '_' after a letter; an option's default is of its
    type (a finite float for float), its keys distinct. A strategy declared otherwise, or under a
    name already taken, is refused with one warning; your other strategies still register."""


@hookspec(firstresult=True)
def claim_draft_file(path, metadata) -> str | None:
    """Say which of your strategies runs a draft file: `-md PATH` without `--spec` asks every
    plugin, and the first strategy name returned is used (None: not yours). Return the name or
    an alias of a strategy your plugin registers; any other answer is ignored with one warning.

    path: the file; metadata: its GGUF key/values (a read-only mapping, `api.Metadata`, with typed
    reads such as metadata.str(key, default=None); general.architecture, when present, is a str).
    The core names no strategy itself. A claim that raises is unregistered with a warning."""


@hookspec
def shipped_drafts(model_file) -> list | None:
    """Drafts your plugin ships for this target (a `ModelFile`): a list of `{"strategy": one of
    your strategies, "path": an existing draft file, "tau": suite tau or None, "cpu_speedup": bench
    speedup on a CPU device or None}` (api.offer builds it), or None. With neither `--spec` nor
    `-md`, `generate` speculates with the one of highest tau under the cost-aware length (on a
    CPU device only if its cpu_speedup is at least cli_spec.MIN_CPU_SPEEDUP, 1.05)."""


@hookspec
def kv_cache_write(cache, graph, layer, k_rows, v_rows, positions, n_rows) -> None:
    """THE core cache-write hook: every KV cache write in vkdflash is a call of it.

    When: once per write *recorded* into a Graph -- the target's forward pass, and every
    strategy's KVHandle.write / record_write. A recorded graph replays its writes each time it
    runs without calling the hook again (see kv_cache_written for per-run events).

    cache: a `vkdflash.kv_cache.CacheInfo` (name, types, rotation block sizes; no buffers);
    graph: the Graph the write is recorded into, sealed while wrappers run (recording a
    dispatch into it raises); layer: int; k_rows / v_rows: the f32 device views written
    [n_rows, n_head_kv * head_dim] (RoPE already applied to K; they are read, never changed);
    positions: a device view of n_rows uint32 cache positions.

    The store belongs to the core: it rotates whichever half is quantized and quantizes, in one
    kernel, whatever the wrappers do. A plugin implementation must be an observing wrapper,
    `@hookimpl(wrapper=True)` that yields exactly once; any other kind is refused when the
    plugin loads, and a wrapper that raises or breaks that rule is unregistered with a warning."""


@hookspec
def kv_cache_written(cache, layer, positions) -> None:
    """After a graph ran on the GPU: once per KV cache write it performed, in recorded order.

    cache: the `CacheInfo`; layer: int; positions: a numpy uint32 array, the cache positions
    written in that run. This is the per-step event (a decode step of the target calls it once
    per layer). A plain function; one that raises is unregistered with a warning."""
