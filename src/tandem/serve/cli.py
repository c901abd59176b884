"""`tandem serve` flags → a Plan; prepare the model once, then hand over to the Launcher."""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import sys
from pathlib import Path

from tandem.gateway.config import GatewayConfig, check_processes
from tandem.gateway.history.settings import check_history_settings
from tandem.gateway.types import HISTORY_BACKENDS, MM_PROCESSING_MODES, WORKER_STREAM_CLIENTS
from tandem.log import DEFAULT_LOG_LEVEL
from tandem.serve.children import Console
from tandem.serve.examples import example_image
from tandem.serve.launcher import HOST, Launcher, Plan
from tandem.worker.config import WorkerConfig

# Levels that both the logging module and uvicorn (the gateway) accept.
LOG_LEVELS = ("debug", "info", "warning", "error")
# The children's defaults: `tandem serve` passes these flags on, and its defaults are theirs.
_GATEWAY = GatewayConfig()
_WORKER = WorkerConfig()


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_serve_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "serve",
        help="gateway + prefill + decode workers in one command",
        description="Start prefill and decode workers and a gateway on 127.0.0.1, print how "
        "to call them, and stop them all on Ctrl-C or SIGTERM.",
    )
    p.add_argument("--model", default=_WORKER.model, help="tiny-qwen3-vl, tiny-llava-1.5 or PATH")
    p.add_argument(
        "--prefill", type=_count, default=None, metavar="N", help="prefill workers (default 1)"
    )
    p.add_argument(
        "--decode",
        type=_count,
        default=None,
        metavar="N",
        help="decode workers (default 1); with --aggregated, the number of aggregated workers",
    )
    p.add_argument(
        "--decode-language-model-only",
        action="store_true",
        help="decode workers load no vision tower (M-RoPE models then refuse image requests)",
    )
    p.add_argument("--aggregated", action="store_true", help="workers run --role both, no PD")
    p.add_argument(
        "--mm-processing",
        choices=MM_PROCESSING_MODES,
        default=_GATEWAY.mm_processing,
        help="where images are processed: passed to the gateway",
    )
    p.add_argument(
        "--worker-stream-client",
        choices=WORKER_STREAM_CLIENTS,
        default=_GATEWAY.worker_stream_client,
        help="the gateway's client of Generate streams (h2 or grpcio): passed to the gateway",
    )
    p.add_argument(
        "--history-backend",
        choices=HISTORY_BACKENDS,
        default=_GATEWAY.history_backend,
        help="where stored responses live: passed to the gateway (sqlite: kept across restarts)",
    )
    p.add_argument(
        "--history-sqlite-path",
        type=Path,
        default=_GATEWAY.history_sqlite_path,
        help="the gateway's SQLite file (default: under $TANDEM_HISTORY_DIR or "
        "~/.cache/tandem/history)",
    )
    p.add_argument(
        "--postgres-db-url",
        default=_GATEWAY.postgres_db_url,
        metavar="postgresql://…",
        help="with --history-backend postgres: passed to the gateway",
    )
    p.add_argument(
        "--port", type=int, default=_GATEWAY.port, help="gateway port; 0 picks a free one"
    )
    p.add_argument(
        "--processes",
        type=int,
        default=_GATEWAY.processes,
        help="gateway processes on the one port: passed to the gateway",
    )
    p.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=DEFAULT_LOG_LEVEL,
        help="for every child (and our own [serve] lines)",
    )
    p.set_defaults(run=run_serve, serve_parser=p)


def _check_args(args: argparse.Namespace) -> None:
    parser: argparse.ArgumentParser = args.serve_parser
    if args.aggregated and args.prefill is not None:
        parser.error("--prefill has no meaning with --aggregated (use --decode N for N workers)")
    if args.aggregated and args.decode_language_model_only:
        parser.error("--decode-language-model-only needs separate decode workers (no --aggregated)")
    if not 0 <= args.port < 65536:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    try:  # the gateway's own checks, before any worker loads
        check_history_settings(
            args.history_backend, args.history_sqlite_path, args.postgres_db_url, _GATEWAY.history
        )
        check_processes(args.processes, args.history_backend)
    except ValueError as exc:
        parser.error(str(exc))


def _port_taken(port: int) -> bool:
    # Checked up front so that a busy port fails in a second, not after loading every worker.
    if port == 0:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the gateway binds
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _prepare_model(name: str) -> tuple[str, Path]:
    """Write or find the model here, once, so that children never write it together.

    Returns what the children get (a built-in name keeps its served name; a path is made
    absolute) and the checkpoint directory.
    """
    from tandem.engine.builtin import is_builtin, resolve_model

    model_dir = resolve_model(name)  # prints a line when it writes the checkpoint
    return (name if is_builtin(name) else str(model_dir)), model_dir


def _images_refused(args: argparse.Namespace, model_dir: Path) -> bool:
    """Whether this deployment refuses image requests (language-model-only decode)."""
    from tandem.models.info import load_model_info

    if not args.decode_language_model_only:
        return False
    return load_model_info(model_dir).family.has_mrope or args.mm_processing == "worker"


def _expected_reply(args: argparse.Namespace, model_dir: Path) -> str | None:
    from tandem.engine.builtin import is_builtin
    from tandem.serve.examples import EXPECTED_REPLY

    if not is_builtin(args.model) or _images_refused(args, model_dir):
        return None
    return EXPECTED_REPLY


def _notes(args: argparse.Namespace, model_dir: Path) -> tuple[str, ...]:
    from tandem.engine.builtin import is_builtin
    from tandem.engine.builtin_shapes import TEXT_ONLY_REPLY
    from tandem.models.info import load_model_info

    notes = []
    if is_builtin(args.model):
        # Said up front so that a newcomer knows what a working deployment answers.
        notes.append(
            f"{args.model} is a tiny model trained on pictures of one coloured shape: it "
            'names them ("a red circle") and answers any text alone with '
            f"{TEXT_ONLY_REPLY!r}"
        )
    if not args.decode_language_model_only:
        return tuple(notes)
    if load_model_info(model_dir).family.has_mrope:
        notes.append(
            "decode workers are language-model-only and this model uses M-RoPE: image "
            "requests are refused with 400 pd_decode_language_model_only_mrope (text works; "
            "use --model tiny-llava-1.5 for images)"
        )
    if args.mm_processing == "worker":
        notes.append(
            "--mm-processing worker with language-model-only decode workers: image requests "
            "are refused with 400 pd_decode_language_model_only_media_refs"
        )
    return tuple(notes)


def _history_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The gateway's history flags; by default its SQLite file, so conversations outlive a
    restart of `tandem serve`."""
    flags = ["--history-backend", args.history_backend]
    if args.history_sqlite_path is not None:
        flags += ["--history-sqlite-path", str(args.history_sqlite_path.absolute())]
    if args.postgres_db_url is not None:
        flags += ["--postgres-db-url", args.postgres_db_url]
    return tuple(flags)


def run_serve(args: argparse.Namespace) -> int:
    _check_args(args)
    if _port_taken(args.port):
        print(
            f"tandem serve: port {args.port} is in use; pass --port N (0: any free port)",
            file=sys.stderr,
        )
        return 2
    # Until the launcher installs its handlers, SIGTERM interrupts like Ctrl-C does, so
    # an interrupted model generation still removes its temporary directory.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        from tandem.engine.builtin import UnknownModelError, default_cache_root
        from tandem.engine.builtin_shipped import StaleWeightsError

        try:
            model, model_dir = _prepare_model(args.model)
        except (UnknownModelError, StaleWeightsError) as exc:
            print(f"tandem serve: {exc}", file=sys.stderr)
            return 2
        plan = Plan(
            model=model,
            prefill=args.prefill or 1,
            decode=args.decode or 1,
            aggregated=args.aggregated,
            decode_language_model_only=args.decode_language_model_only,
            mm_processing=args.mm_processing,
            worker_stream_client=args.worker_stream_client,
            history_args=_history_args(args),
            gateway_processes=args.processes,
            port=args.port,
            log_level=args.log_level,
            image=example_image(default_cache_root()),
            notes=_notes(args, model_dir),
            expected_reply=_expected_reply(args, model_dir),
        )
    except KeyboardInterrupt:
        print("tandem serve: interrupted before any process was started", file=sys.stderr)
        return 0
    return Launcher(plan, Console()).run()
