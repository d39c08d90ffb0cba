"""Command graphs: record a sequence of dispatches once, replay it with one queue submit.

Per-step values (positions, lengths) live in buffers the host rewrites between replays, so a
replay re-records nothing. Dependent dispatches are separated by a global compute barrier,
as ggml-vulkan does; independent ones may opt out with `barrier=False`."""
from __future__ import annotations

from dataclasses import dataclass

from .memory import as_view


@dataclass
class Dispatch:
    pipeline: object
    views: list
    groups: tuple
    push: bytes
    barrier: bool
    label: str


class Graph:
    def __init__(self, ctx, timestamps: bool = False):
        self.ctx = ctx
        self.dispatches: list[Dispatch] = []
        self.timestamps = timestamps and ctx.features.timestamps
        self.cmd = None
        self.pool = None
        self.query_pool = None

    def dispatch(self, pipeline, views, groups, push: bytes = b"", barrier: bool = True,
                 label: str | None = None) -> None:
        assert self.cmd is None, "graph already recorded"
        views = [as_view(v) for v in views]
        assert len(views) == pipeline.n_bindings, f"{pipeline.shader}: {len(views)} views for {pipeline.n_bindings} bindings"
        assert len(push) == pipeline.push_size, f"{pipeline.shader}: push {len(push)} != {pipeline.push_size}"
        groups = tuple(int(g) for g in groups) + (1,) * (3 - len(groups))
        self.dispatches.append(Dispatch(pipeline, views, groups, push, barrier, label or pipeline.shader))

    def __len__(self) -> int:
        return len(self.dispatches)

    def _record(self) -> None:
        ctx, vk, ffi = self.ctx, self.ctx.vk, self.ctx.ffi
        n_desc = sum(d.pipeline.n_bindings for d in self.dispatches)
        self.pool = vk.vkCreateDescriptorPool(ctx.device, vk.VkDescriptorPoolCreateInfo(
            maxSets=max(1, len(self.dispatches)), poolSizeCount=1,
            pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                descriptorCount=max(1, n_desc))]), None)
        sets = []
        for d in self.dispatches:
            ds = vk.vkAllocateDescriptorSets(ctx.device, vk.VkDescriptorSetAllocateInfo(
                descriptorPool=self.pool, descriptorSetCount=1, pSetLayouts=[d.pipeline.set_layout]))[0]
            writes = [vk.VkWriteDescriptorSet(
                dstSet=ds, dstBinding=i, descriptorCount=1,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=v.buffer.handle, offset=v.offset, range=v.size)])
                for i, v in enumerate(d.views)]
            vk.vkUpdateDescriptorSets(ctx.device, len(writes), writes, 0, None)
            sets.append(ds)
        if self.timestamps:
            self.query_pool = vk.vkCreateQueryPool(ctx.device, vk.VkQueryPoolCreateInfo(
                queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=2 * len(self.dispatches)), None)
        cmd = ctx.command_buffer()
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
        if self.query_pool:
            vk.vkCmdResetQueryPool(cmd, self.query_pool, 0, 2 * len(self.dispatches))
        barrier = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
        stage = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        for i, (d, ds) in enumerate(zip(self.dispatches, sets)):
            if d.barrier and i:
                vk.vkCmdPipelineBarrier(cmd, stage, stage, 0, 1, [barrier], 0, None, 0, None)
            if self.query_pool:
                vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, self.query_pool, 2 * i)
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline.handle)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline.layout,
                                       0, 1, [ds], 0, None)
            if d.push:
                vk.vkCmdPushConstants(cmd, d.pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                      len(d.push), ffi.from_buffer(d.push))
            vk.vkCmdDispatch(cmd, *d.groups)
            if self.query_pool:
                vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.query_pool, 2 * i + 1)
        vk.vkEndCommandBuffer(cmd)
        self.cmd = cmd

    def run(self) -> None:
        """Replay every recorded dispatch with exactly one queue submit."""
        if self.cmd is None:
            self._record()
        self.ctx.submit(self.cmd)

    def timings(self) -> list[tuple[str, float]]:
        """(label, GPU nanoseconds) per dispatch of the last replay; empty without timestamps."""
        if not self.query_pool:
            return []
        vk, ffi = self.ctx.vk, self.ctx.ffi
        n = 2 * len(self.dispatches)
        data = ffi.new("uint64_t[]", n)
        vk.vkGetQueryPoolResults(self.ctx.device, self.query_pool, 0, n, 8 * n, data, 8,
                                 vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        period = self.ctx.features.timestamp_period_ns
        return [(d.label, (data[2 * i + 1] - data[2 * i]) * period) for i, d in enumerate(self.dispatches)]

    def destroy(self) -> None:
        vk, dev = self.ctx.vk, self.ctx.device
        if self.cmd is not None:
            vk.vkFreeCommandBuffers(dev, self.ctx.pool, 1, [self.cmd])
            self.cmd = None
        if self.pool is not None:
            vk.vkDestroyDescriptorPool(dev, self.pool, None)
            self.pool = None
        if self.query_pool is not None:
            vk.vkDestroyQueryPool(dev, self.query_pool, None)
            self.query_pool = None


def run_once(ctx, pipeline, views: list, groups, push: bytes = b"") -> None:
    """Convenience for one-off dispatches (tests, conformance)."""
    g = Graph(ctx)
    g.dispatch(pipeline, views, groups, push)
    g.run()
    g.destroy()
