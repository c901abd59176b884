"""The tokenizer, chat template and processor files a worker hands gateways, as one zip.

Every protocol's ``GetTokenizer`` streams the same archive in the shared
``smg.grpc.common.GetTokenizerChunk`` message: the data in chunks, the archive's SHA-256
on the last one.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator

from smg_grpc_proto.generated import common_pb2

from tandem.models.info import ModelInfo

# Files a gateway needs to tokenize, render chat and preprocess images like the worker.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
    "config.json",
    "generation_config.json",
)
TOKENIZER_CHUNK = 1 << 20


def tokenizer_archive(info: ModelInfo) -> bytes:
    """The tokenizer, chat template and processor files as one zip."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in TOKENIZER_FILES:
            path = info.model_dir / name
            if path.is_file():
                archive.write(path, arcname=name)
    return buffer.getvalue()


def tokenizer_chunks(archive: bytes) -> Iterator[common_pb2.GetTokenizerChunk]:
    digest = hashlib.sha256(archive).hexdigest()
    chunks = [archive[i : i + TOKENIZER_CHUNK] for i in range(0, len(archive), TOKENIZER_CHUNK)]
    for index, chunk in enumerate(chunks or [b""]):
        last = index == len(chunks) - 1 or not chunks
        yield common_pb2.GetTokenizerChunk(data=chunk, sha256=digest if last else "")
