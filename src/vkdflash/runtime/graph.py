"""Command graphs: record a sequence of dispatches once, replay it with one queue submit.

Per-step values (positions, lengths) live in buffers the host rewrites between replays, so a
replay re-records nothing. Dependent dispatches are separated by a global compute barrier,
as ggml-vulkan does; independent ones may opt out with `barrier=False`."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import VkdflashError
from .memory import TEXEL_FORMATS, TexelView, as_view
from .ownership import call_site, check_recorded, owners_of, read_only_written


@dataclass(frozen=True, eq=False)
class Dispatch:
    pipeline: object
    views: tuple
    groups: tuple
    push: bytes
    barrier: bool
    label: str


class Graph:
    """Dispatches recorded in order. What they bind is kept to the graph: its public surface is
    dispatch, kernels, ready, run, timings, after_run, len and destroy."""

    def __init__(self, ctx, timestamps: bool = False):
        self.ctx = ctx
        self.timestamps = timestamps and ctx.features.timestamps
        self._dispatches: list[Dispatch] = []
        self._after_run: list = []
        self._sealed: str | None = None   # why no dispatch may be recorded now
        self._acting = None               # the Owner recording its own dispatches now
        self._cmd = self._pool = self._query_pool = None
        self._buffer_views: list = []      # VkBufferViews of texel bindings, made when recorded
        ctx.track(self)

    def dispatch(self, pipeline, views, groups, push: bytes = b"", barrier: bool = True,
                 label: str | None = None) -> None:
        label = label or pipeline.shader
        if self._cmd is not None:
            raise VkdflashError(f"{call_site()}: {label} dispatch into a graph that has already run")
        if self._sealed and self._acting is None:
            raise VkdflashError(f"{call_site()} recorded a {label} dispatch while {self._sealed}")
        views = tuple(as_view(v) for v in views)
        owners = owners_of(views)
        for owner in owners - {self._acting}:
            raise VkdflashError(f"{call_site()} binds {owner.name} memory in a {label} dispatch: only the "
                                "cache's own write and attention paths may")
        written = read_only_written(pipeline, views)
        if written:
            raise VkdflashError(f"{call_site()}: a {label} dispatch {written}")
        for i, v in enumerate(views):
            assert isinstance(v, TexelView) == (i in pipeline.texels), f"{label}: binding {i} view kind"
        assert len(views) == pipeline.n_bindings, f"{pipeline.shader}: {len(views)} views for {pipeline.n_bindings} bindings"
        assert len(push) == pipeline.push_size, f"{pipeline.shader}: push {len(push)} != {pipeline.push_size}"
        groups = tuple(int(g) for g in groups) + (1,) * (3 - len(groups))
        d = Dispatch(pipeline, views, groups, push, barrier, label)
        self._dispatches.append(d)
        if owners:
            self._acting.approve(self, d)

    def kernels(self) -> list[tuple]:
        """The keys of the pipelines it dispatches (Context.pipeline's arguments), each once."""
        return list(dict.fromkeys(d.pipeline.key for d in self._dispatches))

    def ready(self) -> None:
        """Wait until every kernel the graph dispatches has compiled (they compile side by side
        from the first dispatch that names them): what a first pass pays beyond running it."""
        for d in self._dispatches:
            d.pipeline.handle  # noqa: B018 (waits)

    @contextmanager
    def on_behalf_of(self, owner):
        """Dispatches recorded inside may bind `owner`'s memory (the owner's own code only);
        re-entrant, as a sealed() or on_behalf_of() inside restores what it found."""
        before, self._acting = self._acting, owner
        try:
            yield
        finally:
            self._acting = before

    @contextmanager
    def sealed(self, why: str):
        """No dispatch may be recorded inside (except on behalf of an owner): `why` says why. A
        cache write inside (a kv_cache_write wrapper storing into a cache of its own) once ended
        the seal for every wrapper after it: what was sealed stays sealed."""
        before, self._sealed = self._sealed, why
        try:
            yield
        finally:
            self._sealed = before

    def after_run(self, fn) -> None:
        """Call fn() after every run of this graph, once the GPU has finished it."""
        self._after_run.append(fn)

    def __len__(self) -> int:
        return len(self._dispatches)

    def _record(self) -> None:
        check_recorded(self, self._dispatches)
        ctx, vk, ffi = self.ctx, self.ctx.vk, self.ctx.ffi
        n_desc = sum(d.pipeline.n_bindings for d in self._dispatches)
        self._pool = vk.vkCreateDescriptorPool(ctx.device, vk.VkDescriptorPoolCreateInfo(
            maxSets=max(1, len(self._dispatches)), poolSizeCount=2,
            pPoolSizes=[vk.VkDescriptorPoolSize(type=t, descriptorCount=max(1, n_desc)) for t in
                        (vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, vk.VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER)]), None)
        sets = []
        for d in self._dispatches:
            ds = vk.vkAllocateDescriptorSets(ctx.device, vk.VkDescriptorSetAllocateInfo(
                descriptorPool=self._pool, descriptorSetCount=1, pSetLayouts=[d.pipeline.set_layout]))[0]
            writes = [self._descriptor(ds, i, d.pipeline.descriptor_type(i), v) for i, v in enumerate(d.views)]
            vk.vkUpdateDescriptorSets(ctx.device, len(writes), writes, 0, None)
            sets.append(ds)
        if self.timestamps:
            self._query_pool = vk.vkCreateQueryPool(ctx.device, vk.VkQueryPoolCreateInfo(
                queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=2 * len(self._dispatches)), None)
        cmd = ctx.command_buffer()
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
        if self._query_pool:
            vk.vkCmdResetQueryPool(cmd, self._query_pool, 0, 2 * len(self._dispatches))
        barrier = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
        stage = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        for i, (d, ds) in enumerate(zip(self._dispatches, sets)):
            if d.barrier and i:
                vk.vkCmdPipelineBarrier(cmd, stage, stage, 0, 1, [barrier], 0, None, 0, None)
            if self._query_pool:
                vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, self._query_pool, 2 * i)
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline.handle)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline.layout,
                                       0, 1, [ds], 0, None)
            if d.push:
                vk.vkCmdPushConstants(cmd, d.pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                      len(d.push), ffi.from_buffer(d.push))
            vk.vkCmdDispatch(cmd, *d.groups)
            if self._query_pool:
                vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self._query_pool, 2 * i + 1)
        vk.vkEndCommandBuffer(cmd)
        self._cmd = cmd

    def _descriptor(self, ds, binding: int, kind: int, v):
        vk = self.ctx.vk
        if not isinstance(v, TexelView):
            return vk.VkWriteDescriptorSet(dstSet=ds, dstBinding=binding, descriptorCount=1, descriptorType=kind,
                                           pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=v.buffer.handle,
                                                                                  offset=v.offset, range=v.size)])
        fmt = getattr(vk, "VK_FORMAT_" + TEXEL_FORMATS[v.format][0])
        bv = vk.vkCreateBufferView(self.ctx.device, vk.VkBufferViewCreateInfo(
            buffer=v.buffer.handle, format=fmt, offset=v.offset, range=v.size), None)
        self._buffer_views.append(bv)
        return vk.VkWriteDescriptorSet(dstSet=ds, dstBinding=binding, descriptorCount=1, descriptorType=kind,
                                       pTexelBufferView=[bv])

    def run(self) -> None:
        """Replay every recorded dispatch with exactly one queue submit."""
        if self._cmd is None:
            self._record()
        self.ctx.submit(self._cmd)
        for fn in self._after_run:
            fn()

    def timings(self) -> list[tuple[str, float]]:
        """(label, GPU nanoseconds) per dispatch of the last replay; empty without timestamps."""
        if not self._query_pool:
            return []
        vk, ffi = self.ctx.vk, self.ctx.ffi
        n = 2 * len(self._dispatches)
        data = ffi.new("uint64_t[]", n)
        vk.vkGetQueryPoolResults(self.ctx.device, self._query_pool, 0, n, 8 * n, data, 8,
                                 vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        period = self.ctx.features.timestamp_period_ns
        return [(d.label, (data[2 * i + 1] - data[2 * i]) * period) for i, d in enumerate(self._dispatches)]

    def destroy(self) -> None:
        vk, dev = self.ctx.vk, self.ctx.device
        self.ctx.untrack(self)
        if self._cmd is not None:
            vk.vkFreeCommandBuffers(dev, self.ctx.pool, 1, [self._cmd])
            self._cmd = None
        if self._pool is not None:
            vk.vkDestroyDescriptorPool(dev, self._pool, None)
            self._pool = None
        if self._query_pool is not None:
            vk.vkDestroyQueryPool(dev, self._query_pool, None)
            self._query_pool = None
        for bv in self._buffer_views:
            vk.vkDestroyBufferView(dev, bv, None)
        self._buffer_views = []


def run_once(ctx, pipeline, views: list, groups, push: bytes = b"") -> None:
    """Convenience for one-off dispatches (tests, conformance)."""
    g = Graph(ctx)
    g.dispatch(pipeline, views, groups, push)
    g.run()
    g.destroy()
