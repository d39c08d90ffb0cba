"""GGML tensor types the kernels handle: ids (as in ggml.h and GGUF), block geometry, roles."""
from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as GT

from ..errors import VkdflashError


@dataclass(frozen=True)
class TensorType:
    name: str
    id: int          # ggml type id, passed to shaders as a specialization constant
    qk: int          # elements per block (plain types: 1)
    block_bytes: int

    def row_bytes(self, n: int) -> int:
        if n % self.qk:
            raise VkdflashError(f"{self.name} rows need a multiple of {self.qk} values, got {n}")
        return n // self.qk * self.block_bytes

    @property
    def quantized(self) -> bool:
        return self.qk > 1

    @property
    def gguf(self) -> GT:
        return GT(self.id)


def _t(name: str, gt: GT, qk: int, nbytes: int) -> TensorType:
    return TensorType(name, int(gt), qk, nbytes)


TYPES = {t.name: t for t in [
    _t("f32", GT.F32, 1, 4), _t("f16", GT.F16, 1, 2), _t("bf16", GT.BF16, 1, 2),
    _t("q8_0", GT.Q8_0, 32, 34), _t("q4_0", GT.Q4_0, 32, 18), _t("q4_1", GT.Q4_1, 32, 20),
    _t("q5_0", GT.Q5_0, 32, 22), _t("q5_1", GT.Q5_1, 32, 24), _t("iq4_nl", GT.IQ4_NL, 32, 18),
    _t("q4_k", GT.Q4_K, 256, 144), _t("q6_k", GT.Q6_K, 256, 210),
]}
BY_ID = {t.id: t for t in TYPES.values()}

WEIGHT_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q6_k"]
CACHE_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]


def get_type(name_or_id) -> TensorType:
    """Look a type up by name ('q4_0', 'Q4_0') or ggml id; unknown types are a one-line error."""
    if isinstance(name_or_id, int) or hasattr(name_or_id, "value"):
        t = BY_ID.get(int(name_or_id))
        if t is None:
            raise VkdflashError(f"unsupported tensor type id {int(name_or_id)}")
        return t
    t = TYPES.get(str(name_or_id).lower())
    if t is None:
        raise VkdflashError(f"unknown tensor type {name_or_id!r}; known: {', '.join(TYPES)}")
    return t
