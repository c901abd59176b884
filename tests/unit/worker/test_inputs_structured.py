"""The wire's constraint oneof and logprob fields as the engine takes them (or refuses them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tandem.engine.refusals import RefusedField
from tandem.engine.structured_spec import Constraint, StructuredOutputError
from tandem.wire.proto import pb
from tandem.worker.vllm.inputs import sampling_config, wire_constraint


def params(**fields: object) -> pb.SamplingParams:
    return pb.SamplingParams(max_tokens=4, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"json_schema": '{"type": "object"}'}, Constraint("json_schema", '{"type": "object"}')),
        ({"regex": "a+"}, Constraint("regex", "a+")),
        ({"grammar": 'root ::= "a"'}, Constraint("grammar", 'root ::= "a"')),
        ({"structural_tag": "{}"}, Constraint("structural_tag", "{}")),
        ({"json_object": True}, Constraint("json_object")),
        (
            {"choice": pb.ChoiceConstraint(choices=["x", "y"])},
            Constraint("choice", choices=("x", "y")),
        ),
    ],
)
def test_each_constraint_reaches_the_engine(fields: dict, expected: Constraint | None) -> None:
    assert wire_constraint(params(**fields)) == expected


def test_json_object_false_is_refused_not_ignored() -> None:
    with pytest.raises(StructuredOutputError, match="json_object must be true") as info:
        wire_constraint(params(json_object=False))
    assert info.value.code == "invalid_structured_output"


def test_logprobs_are_read_and_unset_means_none() -> None:
    config = sampling_config(params(), 10, 100, 263)
    assert config.logprobs is None
    assert sampling_config(params(logprobs=0), 10, 100, 263).logprobs == 0
    assert sampling_config(params(logprobs=20), 10, 100, 263).logprobs == 20


@pytest.mark.parametrize("value", [-1, 21, 1000])
def test_logprobs_outside_0_to_20_are_invalid(value: int) -> None:
    with pytest.raises(ValueError, match=r"logprobs must be in 0\.\.20"):
        sampling_config(params(logprobs=value), 10, 100, 263)


def test_prompt_logprobs_are_refused() -> None:
    with pytest.raises(RefusedField, match="prompt_logprobs") as info:
        sampling_config(params(prompt_logprobs=0), 10, 100, 263)
    assert info.value.code == "unsupported_parameter"


@pytest.mark.processes
def test_the_worker_imports_without_xgrammar() -> None:
    # xgrammar is imported on the first constrained request only: a worker without it
    # starts and serves everything else.
    probe = (
        "import sys; sys.modules['xgrammar'] = None\n"
        "import tandem.worker.server, tandem.engine.core, tandem.engine.null\n"
        "assert sys.modules['xgrammar'] is None\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120)
