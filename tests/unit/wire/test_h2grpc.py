"""Tandem's HTTP/2 gRPC client (tandem/wire/h2grpc) against real grpc.aio servers on
127.0.0.1: messages in order, statuses and trailing metadata as grpc.aio reports them,
deadlines, cancellation seen by the server, flow control both ways, many concurrent
streams, and the connection failures the gateway maps (refused, server gone, restarted)."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from tandem.errors import transport_failure
from tandem.wire.h2grpc.call import NOT_READY
from tandem.wire.h2grpc.channel import H2Channel

SERVICE = "tandem.test.Stream"
METHOD = f"/{SERVICE}/Say"


def _identity(data: bytes) -> bytes:
    return data


class Servicer:
    """``Say``: the request is ``command:argument``; see :meth:`say`."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.received: list[int] = []

    async def say(self, request: bytes, context: grpc.aio.ServicerContext):
        command, _, argument = request.partition(b":")
        self.received.append(len(request))
        if command == b"count":
            for i in range(int(argument)):
                yield str(i).encode()
        elif command == b"big":
            yield b"x" * int(argument)
        elif command == b"fail":
            await context.send_initial_metadata((("greeting", "hello"),))
            yield b"before"
            context.set_trailing_metadata((("tandem-error-code", "image_too_large"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad % input: ✓")
        elif command == b"fail-now":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no room")
        elif command == b"slow":
            # A cancel may reach the handler inside the sleep (CancelledError) or while
            # grpc writes "first" (the generator is then closed at its yield).
            finished = False
            try:
                yield b"first"
                await asyncio.sleep(float(argument))
                finished = True
            finally:
                if not finished:
                    self.cancelled.set()
            yield b"late"
        elif command == b"echo-size":
            yield str(len(request)).encode()


async def _server(port: int = 0) -> tuple[grpc.aio.Server, int, Servicer]:
    servicer = Servicer()
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Say": grpc.unary_stream_rpc_method_handler(
                servicer.say, request_deserializer=_identity, response_serializer=_identity
            )
        },
    )
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
        ]
    )
    server.add_generic_rpc_handlers([handler])
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound, servicer


async def eventually(condition, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def _all(call) -> list[bytes]:
    out = []
    while (message := await call.read()) is not grpc.aio.EOF:
        out.append(message)
    return out


@pytest.fixture
async def served():
    server, port, servicer = await _server()
    channel = H2Channel(f"127.0.0.1:{port}")
    say = channel.unary_stream(METHOD, _identity, _identity)
    yield say, servicer, channel, port
    await channel.close()
    await server.stop(0)


async def test_messages_arrive_in_order_and_the_stream_ends_with_eof(served) -> None:
    say, _, _, _ = served
    assert await _all(say(b"count:50", timeout=10)) == [str(i).encode() for i in range(50)]
    assert await _all(say(b"count:0", timeout=10)) == []


async def test_read_ready_takes_the_messages_that_arrived_and_never_waits(served) -> None:
    say, _, _, _ = served
    call = say(b"count:50", timeout=10)
    assert call.read_ready() is NOT_READY  # nothing can have arrived yet
    assert await call.read() == b"0"
    await eventually(lambda: call.done())  # the rest and the trailers are here
    burst = []
    while (message := call.read_ready()) is not NOT_READY:
        burst.append(message)
    assert burst == [str(i).encode() for i in range(1, 50)]
    assert await call.read() is grpc.aio.EOF  # the end is left to read()


async def test_a_failed_call_has_grpc_aio_status_details_and_trailing_metadata(served) -> None:
    say, _, _, _ = served
    call = say(b"fail:", timeout=10)
    assert await call.read() == b"before"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "bad % input: ✓"  # percent-decoded, UTF-8
    assert ("tandem-error-code", "image_too_large") in tuple(err.trailing_metadata())
    assert ("greeting", "hello") in tuple(err.initial_metadata())
    # a trailers-only answer: no message at all
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await say(b"fail-now:", timeout=10).read()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details() == "no room"


async def test_an_unknown_method_is_unimplemented(served) -> None:
    _, _, channel, _ = served
    other = channel.unary_stream(f"/{SERVICE}/Nothing", _identity, _identity)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await other(b"", timeout=10).read()
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_the_deadline_ends_the_call_and_the_server_sees_it_cancelled(served) -> None:
    say, servicer, _, _ = served
    call = say(b"slow:30", timeout=0.5)
    assert await call.read() == b"first"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(servicer.cancelled.wait(), 5)


async def test_cancel_resets_the_stream_runs_done_callbacks_and_later_reads_raise(
    served,
) -> None:
    say, servicer, _, _ = served
    call = say(b"slow:30", timeout=60)
    done: list[object] = []
    call.add_done_callback(done.append)
    assert await call.read() == b"first"
    assert call.cancel() is True
    assert call.cancel() is False
    assert done == [call] and call.cancelled()
    with pytest.raises(asyncio.CancelledError):
        await call.read()
    await asyncio.wait_for(servicer.cancelled.wait(), 5)
    # the connection goes on serving
    assert await _all(say(b"count:3", timeout=10)) == [b"0", b"1", b"2"]


async def test_flow_control_a_request_and_an_answer_far_above_the_windows(served) -> None:
    say, _, _, _ = served
    request = b"echo-size:" + b"p" * (5 << 20)  # 80x HTTP/2's initial 64 KiB window
    assert await _all(say(request, timeout=30)) == [str(len(request)).encode()]
    (answer,) = await _all(say(b"big:" + str(3 << 20).encode(), timeout=30))
    assert answer == b"x" * (3 << 20)  # many DATA frames, one message


async def test_many_concurrent_streams_on_one_connection(served) -> None:
    say, _, _, _ = served
    answers = await asyncio.gather(
        *(_all(say(f"count:{n}".encode(), timeout=30)) for n in range(200))
    )
    assert [len(a) for a in answers] == list(range(200))


async def test_a_refused_connection_is_unavailable_in_grpc_cores_words() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    channel = H2Channel(f"127.0.0.1:{port}")
    try:
        say = channel.unary_stream(METHOD, _identity, _identity)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await say(b"count:1", timeout=5).read()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert transport_failure(info.value.code(), info.value.details())
    finally:
        await channel.close()


async def test_a_server_gone_mid_stream_then_back_on_its_port() -> None:
    server, port, _ = await _server()
    channel = H2Channel(f"127.0.0.1:{port}")
    say = channel.unary_stream(METHOD, _identity, _identity)
    try:
        call = say(b"slow:30", timeout=30)
        assert await call.read() == b"first"
        await server.stop(0)  # it ends its calls with UNAVAILABLE, then goes
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as info:  # down: the next call fails too
            await say(b"count:1", timeout=5).read()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        server, _, _ = await _server(port)  # back on the same port: the next call works
        assert await _all(say(b"count:2", timeout=10)) == [b"0", b"1"]
    finally:
        await channel.close()
        await server.stop(0)


async def test_a_message_that_does_not_deserialize_reads_as_none(served) -> None:
    _, _, channel, _ = served

    def strict(data: bytes) -> bytes:
        if data == b"1":
            raise ValueError("not a message")
        return data

    say = channel.unary_stream(METHOD, _identity, strict)
    call = say(b"count:3", timeout=10)
    assert [await call.read() for _ in range(3)] == [b"0", None, b"2"]
    assert await call.read() is grpc.aio.EOF


async def test_a_connection_cut_under_a_live_stream_is_a_transport_failure() -> None:
    """A peer that settles the connection (its SETTINGS), reads the stream's HEADERS and
    drops the connection: the call fails UNAVAILABLE in words ``transport_failure`` knows,
    never hangs."""
    got_request = asyncio.Event()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(bytes(9)[:3] + b"\x04" + bytes(5))  # an empty SETTINGS frame
        seen = b""
        while b"/tandem.test.Stream/Say" not in seen:  # the stream's HEADERS arrived
            seen += await reader.read(4096)
        got_request.set()
        writer.transport.abort()  # RST, not a clean close

    server = await asyncio.start_server(cut, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channel = H2Channel(f"127.0.0.1:{port}")
    try:
        say = channel.unary_stream(METHOD, _identity, _identity)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(say(b"count:1", timeout=30).read(), 10)
        assert got_request.is_set()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert transport_failure(info.value.code(), info.value.details())
    finally:
        await channel.close()
        server.close()
