"""A GPU KV cache next to its numpy reference, written and read only through the documented
KVHandle API, with the checks the cache contract promises: the stored bytes are the reference
quantizer's bytes of the rotated rows, attention matches the reference, and the rows and Q
the caller passed are unchanged."""
from __future__ import annotations

import numpy as np

from vkdflash.conformance import NMSE_ATTENTION, nmse
from vkdflash.kernels.types import get_type
from vkdflash.kv_cache import KVCache, _caches
from vkdflash.ref.kv import KVCache as RefCache
from vkdflash.ref.quantize import dequantize, quant_step
from vkdflash.runtime.graph import Graph
from vkdflash.spec.strategy import KVHandle

HD, N_HEAD_KV, N_HEAD, N_CTX = 64, 2, 4, 24
WIDTH = N_HEAD_KV * HD


def rows(r: np.random.Generator, n: int) -> np.ndarray:
    """n K or V rows in [-1, 1], with a few outlier channels (what rotation is for)."""
    x = r.uniform(-1, 1, (n, WIDTH)).astype(np.float32)
    x[:, ::17] *= 8
    return x


class Probe:
    def __init__(self, ctx, ctk: str, ctv: str, name: str | None = None):
        self.ctx, self.ctk, self.ctv = ctx, ctk, ctv
        self.cache = KVCache(ctx, 1, N_CTX, N_HEAD_KV, HD, ctk, ctv, name=name or f"{ctk}/{ctv}")
        self.handle = KVHandle(self.cache)
        self.ref = RefCache(1, N_HEAD_KV, HD, ctk, ctv)

    def expect(self, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        """What the reference cache holds after the same write."""
        self.ref.write(0, pos, k.reshape(-1, N_HEAD_KV, HD), v.reshape(-1, N_HEAD_KV, HD))

    def check_bytes(self) -> None:
        """Stored rows equal the reference quantizer's bytes of the rotated rows (iq4_nl: within
        one quant step, as in conformance)."""
        n = self.ref.n
        for half, ctype, bufs in (("k", self.ctk, self.cache.k), ("v", self.ctv, self.cache.v)):
            rb = get_type(ctype).row_bytes(WIDTH)
            got = bufs[0].read(np.uint8, n * rb).reshape(n, rb)
            want = self.ref.raw(0, half).reshape(n, rb)
            if ctype == "iq4_nl":
                off = np.abs(dequantize(got, ctype) - dequantize(want, ctype)) / np.maximum(quant_step(want, ctype), 1e-30)
                assert off.max() <= 1 + 1e-6, f"{self.cache.name} {half}: {off.max():.2f} quant steps off"
            else:
                assert np.array_equal(got, want), f"{self.cache.name} {half}: stored bytes differ from the reference"

    def check_attention(self, q: np.ndarray, first_pos: int, graph: Graph | None = None) -> float:
        """Attention of q [n_q, N_HEAD*HD] at first_pos.. through the handle against the
        reference; q must come back unchanged. Records into `graph` when given (then runs it)."""
        n_q = len(q)
        qb, out = self.ctx.upload(q), self.ctx.buffer(q.nbytes)
        params = self.ctx.upload(np.array([first_pos, 0, 0, 0], np.uint32))
        g = graph or Graph(self.ctx)
        try:
            self.handle.attend(g, 0, qb, out, params, n_q, N_HEAD)
            g.run()
            got = out.read(np.float32).reshape(n_q, N_HEAD, HD)
            assert np.array_equal(qb.read(np.float32).reshape(q.shape), q), "attend changed the caller's Q"
        finally:
            g.destroy()
            for b in (qb, out, params):
                b.destroy()
        want = self.ref.attend(0, q.reshape(n_q, N_HEAD, HD), first_pos)
        err = nmse(got, want)
        assert err <= NMSE_ATTENTION, f"{self.cache.name}: attention NMSE {err:.3g} > {NMSE_ATTENTION}"
        return err

    def close(self) -> None:
        if self.cache.info.key in _caches:
            self.cache.destroy()


def queries(r: np.random.Generator, n_q: int) -> np.ndarray:
    return r.uniform(-1, 1, (n_q, N_HEAD * HD)).astype(np.float32)


def reachable_from(root, depth=6, skip=lambda o: False):
    """Every object reachable from root through attributes, slots, lists and dicts."""
    seen, todo, out = set(), [(root, 0)], []
    while todo:
        obj, d = todo.pop()
        if (id(obj) in seen or d > depth or skip(obj)
                or isinstance(obj, (str, bytes, int, float, type(None), np.ndarray))):
            continue
        seen.add(id(obj))
        out.append(obj)
        children = []
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            children = list(obj)
        else:
            children = list(getattr(obj, "__dict__", {}).values())
            children += [getattr(obj, s) for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)]
        todo += [(c, d + 1) for c in children]
    return out
