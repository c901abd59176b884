"""The HTTP/2 client's header-block decoder: the same fields as a plain HPACK decoder for
every block of a connection's life (repeats, new entries, evictions, table size updates),
and a repeated block decoded once."""

from __future__ import annotations

import random

import hpack
import pytest

from tandem.wire.h2grpc.header_blocks import HeaderBlockDecoder

RESPONSE = [(":status", "200"), ("content-type", "application/grpc")]
OK_TRAILERS = [("grpc-status", "0"), ("grpc-message", "")]


def plain(fields: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in fields]


@pytest.mark.parametrize("seed", range(5))
def test_every_block_decodes_as_a_plain_decoder_does(seed: int) -> None:
    chooser = random.Random(seed)
    encoder = hpack.Encoder()
    reference, ours = hpack.Decoder(), HeaderBlockDecoder()
    for step in range(400):
        if step % 97 == 50:  # the encoder shrinks then regrows its table: size updates
            encoder.header_table_size = chooser.choice([0, 256, 4096])
        kind = chooser.random()
        if kind < 0.6:
            headers = chooser.choice([RESPONSE, OK_TRAILERS])
        else:  # a varying value, inserted into the table (and, in a small table, evicting)
            headers = [("grpc-status", str(chooser.randrange(17))), ("x-n", str(step))]
        block = encoder.encode(headers)
        assert ours.decode(block) == plain(reference.decode(block, raw=True)) == headers


def test_a_repeated_block_is_decoded_once() -> None:
    encoder, ours = hpack.Encoder(), HeaderBlockDecoder()
    decodes = 0
    inner = ours._decoder.decode

    def counting(block: bytes, raw: bool = False) -> list:
        nonlocal decodes
        decodes += 1
        return inner(block, raw=raw)

    ours._decoder.decode = counting  # type: ignore[method-assign]
    first = encoder.encode(RESPONSE)  # literals with indexing: changes the table
    ours.decode(first)
    repeat = encoder.encode(RESPONSE)  # now references into the table
    assert repeat != first
    for _ in range(10):
        assert ours.decode(repeat) == RESPONSE
    assert decodes == 2
