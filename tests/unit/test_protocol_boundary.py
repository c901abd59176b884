"""Only a worker protocol's own folder speaks that protocol (issue 31, docs/architecture.md).

In the gateway, vLLM's messages (``smg_grpc_proto``'s modules and Tandem's helpers over
them in ``tandem.wire``) are imported by ``tandem.gateway.backends.vllm`` alone; everything
else works on the neutral types (``backends/frames.py``, ``workers/protocol.py``,
``gateway/backend.py``), and only ``gateway/backend.py`` names the vLLM folder. The worker
is held to the same rule with its vLLM adapter (``tandem.worker.vllm``). At the front, the
same holds for client APIs: only ``gateway/app.py`` imports an endpoint's folder.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tandem

ROOT = Path(tandem.__file__).parent  # src/tandem

# tandem.wire's modules over vLLM's messages; dtypes, pixels (the payload), shm (segments)
# and worker_marker (a metadata key) are protocol-neutral.
VLLM_MODULES = (
    "smg_grpc_proto.generated.vllm_engine_pb2",
    "smg_grpc_proto.generated.vllm_engine_pb2_grpc",
    "tandem.wire.proto",
    "tandem.wire.requests",
    "tandem.wire.kv_params",
    "tandem.wire.pixel_splice",
    "tandem.wire.tensors",
)
ALLOWED_FOLDERS = ("tandem.gateway.backends.vllm", "tandem.worker.vllm", "tandem.wire")
SIDES = ("tandem.gateway", "tandem.worker")
# SGLang's messages, and Tandem's module over them, for its two folders alone.
SGLANG_MODULES = (
    "smg_grpc_proto.generated.sglang_scheduler_pb2",
    "smg_grpc_proto.generated.sglang_scheduler_pb2_grpc",
    "tandem.wire.sglang",
)
SGLANG_FOLDERS = ("tandem.gateway.backends.sglang", "tandem.worker.sglang", "tandem.wire.sglang")
# TokenSpeed's messages (scheduler and encoder), and Tandem's module over them, likewise.
TOKENSPEED_MODULES = (
    "smg_grpc_proto.generated.tokenspeed_scheduler_pb2",
    "smg_grpc_proto.generated.tokenspeed_scheduler_pb2_grpc",
    "smg_grpc_proto.generated.tokenspeed_encoder_pb2",
    "smg_grpc_proto.generated.tokenspeed_encoder_pb2_grpc",
    "tandem.wire.tokenspeed",
)
TOKENSPEED_FOLDERS = (
    "tandem.gateway.backends.tokenspeed",
    "tandem.worker.tokenspeed",
    "tandem.wire.tokenspeed",
)

# TensorRT-LLM's and MLX's messages, and Tandem's modules over them, likewise.
TRTLLM_MODULES = (
    "smg_grpc_proto.generated.trtllm_service_pb2",
    "smg_grpc_proto.generated.trtllm_service_pb2_grpc",
    "tandem.wire.trtllm",
)
TRTLLM_FOLDERS = ("tandem.gateway.backends.trtllm", "tandem.worker.trtllm", "tandem.wire.trtllm")
MLX_MODULES = (
    "smg_grpc_proto.generated.mlx_engine_pb2",
    "smg_grpc_proto.generated.mlx_engine_pb2_grpc",
    "tandem.wire.mlx",
)
MLX_FOLDERS = ("tandem.gateway.backends.mlx", "tandem.worker.mlx", "tandem.wire.mlx")


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


def speaks(names: set[str], modules: tuple[str, ...]) -> bool:
    return any(n == m or n.startswith(m + ".") for n in names for m in modules)


def speaks_vllm(names: set[str]) -> bool:
    return speaks(names, VLLM_MODULES)


def speakers(modules: tuple[str, ...], allowed: tuple[str, ...]) -> set[str]:
    """Modules on either side, outside the allowed folders, that import ``modules``."""
    found: set[str] = set()
    for path in ROOT.rglob("*.py"):
        module = _module_name(path)
        inside = any(module == f or module.startswith(f + ".") for f in allowed)
        if inside or not module.startswith(SIDES):
            continue
        tree = ast.parse(path.read_text())
        if speaks(_imported(tree, module, path.name == "__init__.py"), modules):
            found.add(module)
    return found


def vllm_speakers() -> set[str]:
    return speakers(VLLM_MODULES, ALLOWED_FOLDERS)


def importers(target: str, outside: str) -> set[str]:
    """Modules that are not under ``outside`` and import ``target`` or a module under it."""
    found = set()
    for path in ROOT.rglob("*.py"):
        module = _module_name(path)
        if module.startswith(outside):
            continue
        names = _imported(ast.parse(path.read_text()), module, path.name == "__init__.py")
        if any(n == target or n.startswith(target + ".") for n in names):
            found.add(module)
    return found


def test_only_the_vllm_folders_speak_vllm() -> None:
    speakers = sorted(vllm_speakers())
    assert not speakers, f"modules outside the vLLM folders import vLLM's messages: {speakers}"


def test_only_the_sglang_folders_speak_sglang() -> None:
    found = sorted(speakers(SGLANG_MODULES, SGLANG_FOLDERS))
    assert not found, f"modules outside the SGLang folders import SGLang's messages: {found}"


def test_only_the_tokenspeed_folders_speak_tokenspeed() -> None:
    found = sorted(speakers(TOKENSPEED_MODULES, TOKENSPEED_FOLDERS))
    assert not found, f"modules outside the TokenSpeed folders import its messages: {found}"


def test_only_the_trtllm_folders_speak_trtllm() -> None:
    found = sorted(speakers(TRTLLM_MODULES, TRTLLM_FOLDERS))
    assert not found, f"modules outside the TensorRT-LLM folders import its messages: {found}"


def test_only_the_mlx_folders_speak_mlx() -> None:
    found = sorted(speakers(MLX_MODULES, MLX_FOLDERS))
    assert not found, f"modules outside the MLX folders import its messages: {found}"


@pytest.mark.parametrize("protocol", ["vllm", "sglang", "tokenspeed", "trtllm", "mlx"])
def test_only_the_backend_chooser_names_a_protocol_folder(protocol: str) -> None:
    """A protocol is a folder and a line in ``gateway/backend.py``; no protocol's folder
    names another's."""
    folder = f"tandem.gateway.backends.{protocol}"
    naming = importers(folder, outside=folder)
    assert naming == {"tandem.gateway.backend"}


def test_the_check_sees_each_form_of_import() -> None:
    assert speaks_vllm({"smg_grpc_proto.generated.vllm_engine_pb2"})
    assert not speaks_vllm({"smg_grpc_proto.generated.common_pb2"})  # every protocol's
    assert speaks_vllm({"tandem.wire.proto", "tandem.wire.proto.pb"})
    assert not speaks_vllm({"tandem.wire.shm", "tandem.wire.protocol_neutral"})
    tree = ast.parse("from ..wire import proto\n")
    assert speaks_vllm(_imported(tree, "tandem.gateway.x", False))


def test_only_the_app_and_the_endpoints_name_an_endpoint() -> None:
    """Past its conversion nothing reads an endpoint's schema (issue 31): the pipeline,
    the backends and the HTTP edge import no module of ``gateway/endpoints``, and only the
    composition root (``gateway/app.py``) gathers their routes."""
    naming = importers("tandem.gateway.endpoints", outside="tandem.gateway.endpoints")
    assert naming == {"tandem.gateway.app"}
