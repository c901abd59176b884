"""A processor as an image pool process gets it, and the fingerprint of what it makes."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from weakref import WeakKeyDictionary

from blake3 import blake3

from tandem.media import MediaPolicy
from tandem.models.info import ModelInfo
from tandem.models.processor import ImageProcessor


@dataclass(frozen=True, slots=True)
class ProcessorSpec:
    """A processor as a pool process gets it, and the fingerprint of what it makes."""

    fingerprint: str
    blob: bytes


_SPECS: WeakKeyDictionary[ImageProcessor, dict[tuple[bool, bool], ProcessorSpec]] = (
    WeakKeyDictionary()
)


def processor_spec(
    processor: ImageProcessor, info: ModelInfo, policy: MediaPolicy, raw: bool
) -> ProcessorSpec:
    """The pickled processor and the fingerprint of (model, processor config, options).

    The fingerprint keys the pixel cache with the image's hash: two models, two processor
    configs or raw vs normalized output never share an entry. Computed once per processor.
    """
    per = _SPECS.setdefault(processor, {})
    options = (raw, policy.jpeg_draft)  # jpeg_draft changes the decoded pixels
    spec = per.get(options)
    if spec is None:
        blob = pickle.dumps(processor, protocol=pickle.HIGHEST_PROTOCOL)
        identity = repr((str(info.model_dir), info.model_type, info.image_token_id, options))
        digest = blake3(identity.encode())
        digest.update(blob)
        spec = ProcessorSpec(digest.hexdigest(), blob)
        per[options] = spec
    return spec
