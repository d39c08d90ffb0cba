"""A draft's LM head over the tokens it is likely to propose (frequency-ranked drafting, as in
FR-Spec, arXiv 2502.14856).

A draft's LM head has a row per vocabulary token (SmolLM2: 49152 x 576), and where a matmul's
cost is its rows (CPU devices; GPUs too for 128K+ vocabularies) it is most of what a draft
costs. A draft file may list the tokens of its training data, most frequent first
(DRAFT_VOCAB); a strategy then computes logits for the first N only (its `vocab` setting) and
maps each argmax back to a token id. A token outside them is never proposed, but is still
verified, committed and emitted as usual, so output does not change. At T > 0 the draft's
distribution is over the N tokens and zero elsewhere, which keeps speculative sampling exact."""
from __future__ import annotations

import numpy as np

from ..errors import VkdflashError
from ..model.gguf_file import TensorData
from .strategy import Option

DRAFT_VOCAB = "vkdflash.draft.vocab"  # token ids, most frequent first
DEFAULT_SIZE = 8192  # SmolLM2's training data: the first 8192 cover 97.9% of held-out tokens
VOCAB = Option("vocab", int, DEFAULT_SIZE, "LM head rows: the draft file's most frequent tokens (0: every token)")


class DraftVocab:
    """Token ids a draft's LM head covers (row i of the narrowed head is token ids[i])."""

    def __init__(self, ids, n_vocab: int):
        self.ids = np.asarray(ids, np.int64)
        self.n_vocab = int(n_vocab)

    @property
    def size(self) -> int:
        return len(self.ids)

    def rows(self, tensor: TensorData) -> TensorData:
        """The rows of a [n_vocab, d] GGUF tensor (an LM head, an embedding) for these tokens, in
        its own block layout, so each row's logit is the bits the whole head would give."""
        if len(tensor.shape) != 2 or tensor.shape[1] != self.n_vocab:
            raise VkdflashError(f"draft vocabulary: a tensor of shape {tuple(tensor.shape)} has no row per "
                                f"token of the {self.n_vocab}-token vocabulary")
        raw = np.asarray(tensor.data).reshape(self.n_vocab, -1)
        return TensorData(tensor.type_id, (tensor.shape[0], self.size), np.ascontiguousarray(raw[self.ids]))

    def head(self, store, tensor: TensorData, name: str):
        """The rows of `tensor` for these tokens as a Weight in `store` (a DeviceStore)."""
        return store.matrix(self.rows(tensor), f"{name}[{self.size} tokens]")

    def tokens(self, idx) -> list:
        """Token ids of row indices of the narrowed head (its argmax)."""
        return [int(t) for t in self.ids[np.asarray(idx, np.int64)]]

    def widen(self, probs: np.ndarray) -> np.ndarray:
        """[n, size] distributions over the covered tokens as [n, n_vocab], zero elsewhere."""
        out = np.zeros((len(probs), self.n_vocab), probs.dtype)
        out[:, self.ids] = probs
        return out


def draft_vocab(metadata, n_vocab: int, settings: dict) -> DraftVocab | None:
    """The first `vocab` (a strategy setting, VOCAB) tokens a draft file lists (None: it lists
    none, or the setting is 0: the whole vocabulary). A bad list is refused in one line."""
    size = int(settings.get(VOCAB.key, VOCAB.default))
    if size < 0:
        raise VkdflashError(f"--spec-opt ...vocab={size}: must be >= 0 (0: the whole vocabulary)")
    ids = metadata.ints(DRAFT_VOCAB, 0, n_vocab - 1, n_vocab, default=None)
    if ids is None or size == 0 or len(ids) == 0:
        return None
    if len(np.unique(ids)) != len(ids):
        raise VkdflashError(f"metadata {DRAFT_VOCAB} lists a token twice")
    ids = ids[:size]
    return None if len(ids) == n_vocab else DraftVocab(ids, n_vocab)
