"""The public plugin API: everything a strategy plugin needs, from one import.

    from vkdflash import api            # or: import vkdflash; @vkdflash.hookimpl ...

Names here are stable for plugin authors; anything else in vkdflash is internal and may change.
The built-in plugins (ngram, dflash, mtp) import nothing else, and a test keeps it that way.
docs/plugins.md is the tutorial and the reference for every name below."""
from __future__ import annotations

from .errors import VkdflashError, quote
from .hookspecs import hookimpl
from .kernels.attention import MAX_HEAD_DIM
from .kernels.blocks import dequantize, quantize
from .kernels.copy import copy
from .kernels.elementwise import add, mul, scale, swiglu
from .kernels.embed import get_rows
from .kernels.matmul import matmul
from .kernels.norm import rms_norm
from .kernels.rope import rope
from .kernels.softmax import argmax, softmax
from .kernels.types import CACHE_TYPES, TensorType, get_type
from .kernels.weights import Weight
from .kv_cache import CacheInfo
from .model.block import BlockBuffers, BlockShape, BlockWeights, project, record_block, write_kv
from .model.gguf_file import GGUFFile, TensorData
from .model.model_file import ModelFile, check_tensors, load_model, nextn_tensors
from .model.hparams import (ARCHITECTURES, MAX_EMBD, MAX_LAYERS, MAX_VOCAB, RMS_EPS, ROPE_BASE, HParams,
                            check_rope_scaling, nextn_hidden, read_heads)
from .model.metadata import Metadata
from .model.store import DeviceStore
from .runtime.graph import Graph
from .runtime.memory import Buffer, View
from .spec.drafts import draft_distribution, sample_drafts, select_drafts, top1_probability
from .spec.shipped import Record, offer, shipped_draft, suite_record
from .spec.strategy import KVHandle, Option, Proposal, Strategy, StrategyContext, StrategyOptions
from .spec.vocab import DRAFT_VOCAB, VOCAB, DraftVocab, draft_vocab

__all__ = [
    # plugins and strategies
    "hookimpl", "Strategy", "Proposal", "StrategyContext", "StrategyOptions", "Option", "KVHandle", "CacheInfo",
    "select_drafts", "sample_drafts", "draft_distribution", "top1_probability", "VkdflashError",
    # drafts shipped with a plugin for a target, and what they measured
    "shipped_draft", "suite_record", "offer", "Record",
    # a draft's LM head over its most frequent tokens
    "DraftVocab", "draft_vocab", "DRAFT_VOCAB", "VOCAB",
    # recording GPU work: graphs, memory, weights, kernels
    "Graph", "Buffer", "View", "DeviceStore", "Weight", "matmul", "rms_norm", "rope", "get_rows",
    "add", "mul", "scale", "swiglu", "softmax", "argmax", "copy", "MAX_HEAD_DIM",
    # the decoder block the target, MTP, DFlash and any drafter share
    "BlockShape", "BlockWeights", "BlockBuffers", "record_block", "write_kv", "project",
    # GGUF files and their tensors
    "GGUFFile", "ModelFile", "load_model", "TensorData", "check_tensors", "nextn_tensors", "HParams",
    "Metadata", "read_heads", "check_rope_scaling", "nextn_hidden", "ARCHITECTURES", "MAX_EMBD", "MAX_LAYERS", "MAX_VOCAB",
    "RMS_EPS", "ROPE_BASE", "quote",
    "TensorType", "get_type", "CACHE_TYPES", "quantize", "dequantize",
]
