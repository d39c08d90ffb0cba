"""Hook specifications: everything a vkdflash plugin can implement.

Plugins register through the `vkdflash` entry-point group (built-in ones in plugins/ exactly
like third-party ones); VKDFLASH_PLUGINS=name,name restricts which load. Implement hooks with
`@vkdflash.hookimpl`."""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("vkdflash")
hookimpl = pluggy.HookimplMarker("vkdflash")


@hookspec
def register_strategies(register) -> None:
    """Register speculative strategies.

    Call `register(name, factory, description="")` once per strategy, where
    `factory(ctx: vkdflash.spec.StrategyContext) -> vkdflash.spec.Strategy` builds one for a
    generation request. `name` is what `--spec NAME` selects."""


@hookspec
def kv_cache_write(cache, graph, layer, k_rows, v_rows, positions, n_rows) -> None:
    """THE core cache-write hook: every KV cache write in vkdflash goes through it.

    cache: a `vkdflash.kv_cache.CacheInfo` (name, types, rotation block sizes; no buffers);
    graph: the runtime Graph the write is recorded into; layer: int; k_rows / v_rows: f32
    device views [n_rows, n_head_kv * head_dim] (RoPE already applied to K); positions: a
    device view of n_rows uint32 cache positions.

    The implementation belongs to the core: it rotates whichever half is quantized and then
    quantizes and stores. Plugins may wrap it (`@hookimpl(wrapper=True)`) to observe writes;
    they cannot replace it -- the core checks that its implementation ran."""
