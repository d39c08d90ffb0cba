"""GGUF model files: parsing, validation for the supported architectures, the default model."""
from .describe import inspect_file
from .fetch import default_model_path
from .gguf_file import GGUFFile, TensorData, TensorInfo
from .model_file import ModelFile, expected_tensors, load_model
from .hparams import ARCHITECTURES, HParams

__all__ = ["ARCHITECTURES", "GGUFFile", "HParams", "ModelFile", "TensorData", "TensorInfo", "default_model_path",
           "expected_tensors", "inspect_file", "load_model"]
