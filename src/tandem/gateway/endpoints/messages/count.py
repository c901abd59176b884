"""``POST /v1/messages/count_tokens``: the prompt's tokens, as ``/v1/messages`` would send them.

The conversation goes through the same conversion as a Messages request (``convert.py``),
then the chat route's rendering and tokenization (``pipeline/prompt.py``); each image's
anchor is expanded to its token run by the router path's processing, as ``/tokenize`` does
(``endpoints/tokenize/route.py``). So ``input_tokens`` equals the ``usage.input_tokens`` of
the same request. No worker is called; the request holds an admission slot like any other.
"""

from __future__ import annotations

from tandem.gateway.endpoints.messages.convert import chat_request
from tandem.gateway.endpoints.messages.schema import parse_count_tokens_request
from tandem.gateway.endpoints.tokenize.route import expand_images
from tandem.gateway.http.inbound import HttpInbound
from tandem.gateway.pipeline.gates import served_model
from tandem.gateway.pipeline.prompt import check_takes_video, render_chat
from tandem.gateway.state import GatewayState
from tandem.gateway.tokenizing import more_text_than, off_loop_if, parse_large_off_loop


async def count_tokens(state: GatewayState, inbound: HttpInbound) -> dict[str, int]:
    config = state.config
    raw = await inbound.read_body(config.max_payload_size)
    body = await parse_large_off_loop(raw, parse_count_tokens_request)
    chat = chat_request(body, config.reasoning_parser)
    model = await served_model(state, chat.model)
    messages, tools = chat.template_messages(), chat.template_tools()
    parts = chat.media_parts()
    if any(kind == "video" for kind, _ in parts):
        check_takes_video(model)

    def encode() -> list[int]:
        return model.encode(render_chat(model, messages, tools))

    ids = await off_loop_if(more_text_than([messages, tools]), encode)
    if parts:
        ids = await inbound.until_disconnect(expand_images(state, model, ids, parts))
    return {"input_tokens": len(ids)}
