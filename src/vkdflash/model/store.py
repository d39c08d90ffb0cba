"""Device memory made for one model (target, DFlash draft, MTP head): freed together.

Holds the weights uploaded from GGUF tensors, scratch buffers, and the graphs recorded once
per shape and replayed."""
from __future__ import annotations

import numpy as np

from ..kernels.weights import Weight
from ..kernels.blocks import dequantize
from ..runtime.memory import buffer_size


class DeviceStore:
    def __init__(self, ctx):
        self.ctx = ctx
        self._owned: list = []
        self.graphs: dict = {}

    def adopt(self, obj):
        """Take ownership of anything with destroy()."""
        self._owned.append(obj)
        return obj

    def buffer(self, nbytes: int, host: bool = False):
        """Scratch memory; host=True for what the host writes or reads every step (mapped)."""
        return self.adopt(self.ctx.buffer(max(16, buffer_size(nbytes)), host))

    def matrix(self, tensor, name: str) -> Weight:
        """A 2-D GGUF tensor (TensorData), uploaded in its own block layout."""
        return self.adopt(Weight(self.ctx, tensor.type_id, tensor.shape[1], tensor.shape[0], tensor.data, name))

    def stacked(self, tensors, names) -> tuple | None:
        """2-D GGUF tensors of one type and width as one weight of their rows stacked (e.g. Q, K, V:
        one matmul fills all three) and a row slice of it per tensor; None where they cannot be."""
        t0 = tensors[0]
        if any((t.type_id, t.shape[0]) != (t0.type_id, t0.shape[0]) or len(t.shape) != 2 for t in tensors):
            return None
        rows = [int(t.shape[1]) for t in tensors]
        data = np.concatenate([np.ascontiguousarray(t.data).reshape(-1).view(np.uint8) for t in tensors])
        whole = Weight(self.ctx, t0.type_id, sum(rows), t0.shape[0], data, "+".join(names))
        parts = [whole.rows_slice(sum(rows[:i]), r, name) for i, (r, name) in enumerate(zip(rows, names))]
        if any(p is None for p in parts):
            whole.destroy()
            return None
        self.adopt(whole)
        return whole, parts

    def vector(self, tensor, repeat: int = 1):
        """A 1-D GGUF tensor as f32, repeated `repeat` times (biases: once per batch row)."""
        values = dequantize(np.asarray(tensor.data), tensor.type_id, tensor.shape[0]).reshape(-1).astype(np.float32)
        buf = self.buffer(values.nbytes * repeat)
        buf.write(np.tile(values, repeat))
        buf.read_only = "a model's weight vector"  # borrowed by strategies: uploaded once, never changed
        return buf

    def graph(self, key, record):
        """The graph recorded for `key` (by record(), the first time it is asked for)."""
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = record()
        return graph

    def close(self) -> None:
        for g in self.graphs.values():
            g.destroy()
        self.graphs.clear()
        for obj in reversed(self._owned):
            obj.destroy()
        self._owned.clear()
