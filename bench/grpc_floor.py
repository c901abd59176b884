"""What Python gRPC itself costs a gateway per worker call and per streamed message.

The floor under every Tandem leg, measured in isolation: this process (pinned to one CPU)
calls ``Generate`` on a ``null`` worker (pinned to another) in a closed loop and divides
its own CPU time (all threads: grpc's poller thread included) by the calls. Nothing of
Tandem's gateway runs here, only grpcio and the generated stub, or Tandem's HTTP/2 client.

Usage: .venv/bin/python -m bench.grpc_floor [--calls 400] [--client-cpu 0] [--worker-cpu 1]
Prints a Markdown table (a figure for docs/benchmarks.md, not a test).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import grpc
import grpc.experimental
import uvloop

from bench.procs import start_worker, wait_ready
from tandem.gateway.backends.vllm.client import GENERATE
from tandem.wire.h2grpc.channel import H2Channel
from tandem.wire.proto import pb, pb_grpc

LONG_TOKENS = 64  # a streamed answer of this many tokens, one message each (plus the last)


def _request(i: int, max_tokens: int, stream: bool) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=f"floor-{i}", stream=stream)
    req.tokenized.input_ids.extend(range(10, 110))  # ≈ the short_text prompt's size
    req.sampling_params.max_tokens = max_tokens
    return req


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _per_call_ms(run: Callable[[int], int], calls: int) -> tuple[float, float]:
    """(client CPU ms per call, messages per call) over ``calls`` calls after a warm-up."""
    run(-1)
    c0, messages = _cpu_s(), 0
    for i in range(calls):
        messages += run(i)
    return 1000 * (_cpu_s() - c0) / calls, messages / calls


def measure_aio(address: str, calls: int) -> dict[str, tuple[float, float]]:
    async def main() -> dict[str, tuple[float, float]]:
        channel = grpc.aio.insecure_channel(address)
        stub = pb_grpc.VllmEngineStub(channel)
        out: dict[str, tuple[float, float]] = {}
        for label, tokens, stream in (("one", 1, False), ("long", LONG_TOKENS, True)):

            async def one_call(i: int, tokens: int = tokens, stream: bool = stream) -> int:
                return sum([1 async for _ in stub.Generate(_request(i, tokens, stream))])

            await one_call(-1)
            c0, messages = _cpu_s(), 0
            for i in range(calls):
                messages += await one_call(i)
            out[label] = (1000 * (_cpu_s() - c0) / calls, messages / calls)
        await channel.close()
        return out

    return uvloop.run(main())


def measure_h2(address: str, calls: int) -> dict[str, tuple[float, float]]:
    """The same calls through Tandem's own HTTP/2 client (``tandem.wire.h2grpc``)."""

    async def main() -> dict[str, tuple[float, float]]:
        channel = H2Channel(address)
        generate = channel.unary_stream(
            GENERATE, pb.GenerateRequest.SerializeToString, pb.GenerateResponse.FromString
        )
        out: dict[str, tuple[float, float]] = {}
        for label, tokens, stream in (("one", 1, False), ("long", LONG_TOKENS, True)):

            async def one_call(i: int, tokens: int = tokens, stream: bool = stream) -> int:
                call, count = generate(_request(i, tokens, stream), timeout=30), 0
                while await call.read() is not grpc.aio.EOF:
                    count += 1
                return count

            await one_call(-1)
            c0, messages = _cpu_s(), 0
            for i in range(calls):
                messages += await one_call(i)
            out[label] = (1000 * (_cpu_s() - c0) / calls, messages / calls)
        await channel.close()
        return out

    return uvloop.run(main())


def measure_sync(address: str, calls: int) -> dict[str, tuple[float, float]]:
    options = [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
    with grpc.insecure_channel(address, options=options) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        return {
            label: _per_call_ms(
                lambda i, t=tokens, s=stream: sum(1 for _ in stub.Generate(_request(i, t, s))),
                calls,
            )
            for label, tokens, stream in (("one", 1, False), ("long", LONG_TOKENS, True))
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--client-cpu", type=int, default=0)
    parser.add_argument("--worker-cpu", type=int, default=1)
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.client_cpu})
    worker = wait_ready(start_worker("both", str(args.worker_cpu), 0, "tiny-qwen3-vl"))
    try:
        started = time.monotonic()
        rows = {
            "grpc.aio on uvloop": measure_aio(worker.address, args.calls),
            "Tandem's HTTP/2 client on uvloop (tandem/wire/h2grpc)": measure_h2(
                worker.address, args.calls
            ),
            "sync, single-threaded unary-stream": measure_sync(worker.address, args.calls),
        }
    finally:
        worker.stop()
    print(f"{args.calls} calls of each kind in {time.monotonic() - started:.1f} s\n")
    print("| client | CPU ms per call (1 message) | CPU µs per further streamed message |")
    print("|---|---|---|")
    for name, found in rows.items():
        one_ms, _ = found["one"]
        long_ms, long_messages = found["long"]
        per_message_us = 1000 * (long_ms - one_ms) / (long_messages - 1)
        print(f"| {name} | {one_ms:.2f} | {per_message_us:.0f} |")


if __name__ == "__main__":
    main()
