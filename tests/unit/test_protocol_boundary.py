"""Only a worker protocol's own folder speaks that protocol (issue 31, docs/architecture.md).

In the gateway, vLLM's messages (``smg_grpc_proto``'s modules and Tandem's helpers over
them in ``tandem.wire``) are imported by ``tandem.gateway.backends.vllm`` alone; everything
else works on the neutral types (``tandem.gateway.backends.frames``, …). The worker is held
to the same rule with its vLLM adapter.

The move is under way: :data:`NOT_YET_MOVED` names the modules that still speak vLLM's
messages. The test fails when a module outside the folder and the list starts to, and when
a listed module no longer does (so the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

import tandem

ROOT = Path(tandem.__file__).parent  # src/tandem

# tandem.wire's modules over vLLM's messages; shm (segments) and worker_marker (a metadata
# key) are protocol-neutral.
VLLM_MODULES = (
    "smg_grpc_proto",
    "tandem.wire.proto",
    "tandem.wire.requests",
    "tandem.wire.kv_params",
    "tandem.wire.pixels",
    "tandem.wire.tensors",
)
ALLOWED_FOLDERS = ("tandem.gateway.backends.vllm", "tandem.wire")
SIDES = ("tandem.gateway", "tandem.worker")

NOT_YET_MOVED = frozenset(
    {
        "tandem.gateway.context",
        "tandem.gateway.dispatch.leg_bytes",
        "tandem.gateway.dispatch.streams",
        "tandem.gateway.multimodal.assemble",
        "tandem.gateway.multimodal.assemble_video",
        "tandem.gateway.multimodal.inline_refs",
        "tandem.gateway.multimodal.media_refs",
        "tandem.gateway.pd.connector",
        "tandem.gateway.pd.dispatcher",
        "tandem.gateway.pd.fanout",
        "tandem.gateway.pd.forms",
        "tandem.gateway.pd.identity_relay",
        "tandem.gateway.pd.parallel",
        "tandem.gateway.pd.sequential",
        "tandem.gateway.pipeline.wire_request",
        "tandem.gateway.workers.client",
        "tandem.gateway.workers.labels",
        "tandem.gateway.workers.tensor_transport",
        "tandem.worker.handoff",
        "tandem.worker.info",
        "tandem.worker.inputs",
        "tandem.worker.leg_counter",
        "tandem.worker.logprob_wire",
        "tandem.worker.media_refs",
        "tandem.worker.output_plan",
        "tandem.worker.server",
        "tandem.worker.servicer",
    }
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            stem = node.module or ""
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                stem = ".".join([*base, stem] if stem else base)
            names.add(stem)
            names.update(f"{stem}.{alias.name}" for alias in node.names)
    return names


def speaks_vllm(names: set[str]) -> bool:
    return any(n == m or n.startswith(m + ".") for n in names for m in VLLM_MODULES)


def vllm_speakers() -> set[str]:
    """Modules on either side, outside the allowed folders, that import vLLM's messages."""
    found: set[str] = set()
    for path in ROOT.rglob("*.py"):
        module = _module_name(path)
        inside = any(module == f or module.startswith(f + ".") for f in ALLOWED_FOLDERS)
        if inside or not module.startswith(SIDES):
            continue
        tree = ast.parse(path.read_text())
        if speaks_vllm(_imported(tree, module, path.name == "__init__.py")):
            found.add(module)
    return found


def test_only_the_vllm_folders_speak_vllm() -> None:
    speakers = vllm_speakers()
    new = sorted(speakers - NOT_YET_MOVED)
    assert not new, f"modules outside the vLLM folders import vLLM's messages: {new}"
    moved = sorted(NOT_YET_MOVED - speakers)
    assert not moved, f"no longer speak vLLM: take them off NOT_YET_MOVED: {moved}"


def test_the_check_sees_each_form_of_import() -> None:
    assert speaks_vllm({"smg_grpc_proto.generated.vllm_engine_pb2"})
    assert speaks_vllm({"tandem.wire.proto", "tandem.wire.proto.pb"})
    assert not speaks_vllm({"tandem.wire.shm", "tandem.wire.protocol_neutral"})
    tree = ast.parse("from ..wire import proto\n")
    assert speaks_vllm(_imported(tree, "tandem.gateway.x", False))
