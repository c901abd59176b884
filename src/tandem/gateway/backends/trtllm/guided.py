"""A structured-output constraint as TensorRT-LLM's ``GuidedDecodingParams``.

The constraint is first turned into the scheduler protocols' form
(``backends/scheduler/constraints.py``: ``json_object`` as the schema of any object, a
``choice`` list as a grammar whose sentences are exactly the choices), whose field names
map one to one onto TensorRT-LLM's guide types. ``GUIDE_TYPE_JSON`` (any JSON value) is
never sent: ``json_object`` asks for an object, which only a schema says.
"""

from __future__ import annotations

from tandem.gateway.backends.scheduler.constraints import constraint_field
from tandem.gateway.pipeline.generation_request import Constraint
from tandem.wire.trtllm import trpb

_Guide = trpb.GuidedDecodingParams
GUIDE_TYPES = {
    "json_schema": _Guide.GUIDE_TYPE_JSON_SCHEMA,
    "regex": _Guide.GUIDE_TYPE_REGEX,
    "ebnf_grammar": _Guide.GUIDE_TYPE_EBNF_GRAMMAR,
    "structural_tag": _Guide.GUIDE_TYPE_STRUCTURAL_TAG,
}


def set_guide(request: trpb.GenerateRequest, constraint: Constraint) -> None:
    """``request.guided_decoding`` for ``constraint`` (400 for a choice with a NUL)."""
    field, guide = constraint_field(constraint.kind, constraint.value)
    request.guided_decoding.guide_type = GUIDE_TYPES[field]
    request.guided_decoding.guide = guide
