"""GGUF: a bounded lazy header reader and describe() -> ModelInfo.

Import-light by design: nothing here imports httpx, psutil, pynvml, subprocess, numpy or gguf-py.

    read_header(path) -> Header          every split part merged; GGUFFormatError on any format problem
    describe(path_or_header) -> ModelInfo
"""

from bostudio.gguf.describe import ModelInfo, RopeInfo, describe, describe_header, size_label_for
from bostudio.gguf.reader import ArrayRef, ByteSource, BytesSource, Field, Header, TensorInfo, ValueType, parse_header
from bostudio.gguf.split import merge_parts, read_header, split_part_names
from bostudio.gguf.tokenizer import TokenizerInfo

__all__ = [
    "ArrayRef", "ByteSource", "BytesSource", "Field", "Header", "ModelInfo", "RopeInfo", "TensorInfo", "TokenizerInfo",
    "ValueType", "describe", "describe_header", "merge_parts", "parse_header", "read_header",
    "size_label_for", "split_part_names",
]
