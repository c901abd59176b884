"""``POST /tokenize`` and ``POST /detokenize`` (also under ``/v1``), in vLLM's shapes.

The gateway answers both itself, with the tokenizer, chat template and image processor it
serves the model with; no worker is called. A chat request's tokens are the ones the chat
route would send a worker: the same template rendering and tokenization
(``pipeline/prompt.py``), and each image's anchor expanded to the image's own token run by
the router path's processing (fetched under the gateway's media policy, decoded,
preprocessed, counted; the pixels are dropped). Each request holds an admission slot from
before its body is read, as a generation request does, and long inputs are tokenized off the
event loop without holding the GIL (``gateway/tokenizing.py``). See docs/operations.md,
"Tokenize and detokenize".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tokenizers import Tokenizer

from tandem.errors import TandemError, make_error
from tandem.gateway.admission import PixelLease
from tandem.gateway.endpoints.tokenize.schema import (
    TokenizeChatRequest,
    TokenizePromptRequest,
    parse_detokenize_request,
    parse_tokenize_request,
)
from tandem.gateway.http.inbound import HttpInbound
from tandem.gateway.http.json_bodies import error_response, json_response
from tandem.gateway.model import ModelHandle
from tandem.gateway.multimodal.plan import MediaPlan
from tandem.gateway.multimodal.process import process_images
from tandem.gateway.multimodal.videos import process_videos
from tandem.gateway.pipeline.gates import admit, media_in_time, served_model
from tandem.gateway.pipeline.media import checked_media_plan
from tandem.gateway.pipeline.prompt import check_takes_video, render_chat
from tandem.gateway.pipeline.run import ClientGone
from tandem.gateway.state import GatewayState
from tandem.gateway.tokenizing import (
    INLINE_CHARS,
    INLINE_TOKENS,
    decode_ids,
    encode_ids,
    json_in_pieces,
    more_text_than,
    off_loop_if,
    parse_large_off_loop,
)
from tandem.models.placeholders import expand_media

log = logging.getLogger("tandem.gateway")

TOKENIZE_PATHS = ("/tokenize", "/v1/tokenize")
DETOKENIZE_PATHS = ("/detokenize", "/v1/detokenize")


def tokenize_routes(state: GatewayState) -> list[Route]:
    async def tokenize(request: Request) -> Response:
        return await _answer(state, request, lambda inbound: _tokenize(state, inbound))

    async def detokenize(request: Request) -> Response:
        return await _answer(state, request, lambda inbound: _detokenize(state, inbound))

    return [
        *(Route(path, tokenize, methods=["POST"]) for path in TOKENIZE_PATHS),
        *(Route(path, detokenize, methods=["POST"]) for path in DETOKENIZE_PATHS),
    ]


async def _answer(
    state: GatewayState, request: Request, work: Callable[[HttpInbound], Any]
) -> Response:
    slot = None
    inbound = HttpInbound(request)
    try:
        # The generation routes' admission: a 2 MiB body tokenizes for seconds of CPU, and
        # --max-concurrent-requests is what bounds how many do at once.
        slot = await admit(state, inbound)
        answer = await work(inbound)
        if isinstance(answer, bytes):  # serialized off the event loop already
            return Response(answer, media_type="application/json")
        return json_response(answer)
    except TandemError as err:
        return error_response(err)
    except ClientGone:
        return Response(status_code=499)  # nobody reads it
    except Exception:
        log.exception("unexpected failure on %s", request.url.path)
        return error_response(make_error("internal_error", "internal error; see the gateway log"))
    finally:
        if slot is not None:
            slot.release()


async def _tokenize(state: GatewayState, inbound: HttpInbound) -> dict[str, Any] | bytes:
    config = state.config
    raw = await inbound.read_body(config.max_payload_size)
    body = await parse_large_off_loop(raw, parse_tokenize_request)
    model = await served_model(state, body.model)
    if isinstance(body, TokenizePromptRequest):
        text = body.prompt
        ids = await off_loop_if(
            len(text) > INLINE_CHARS,
            lambda: encode_ids(model.tokenizer, text, body.add_special_tokens),
        )
    else:
        rendered = [body.template_messages(), body.template_tools()]
        ids = await off_loop_if(more_text_than(rendered), lambda: chat_prompt_ids(model, body))
        parts = body.media_parts()
        if parts:
            ids = await inbound.until_disconnect(expand_images(state, model, ids, parts))
    answer = {
        "count": len(ids),
        "max_model_len": model.info.max_context,
        "tokens": ids,
        "token_strs": None,
    }
    many = len(ids) > INLINE_TOKENS
    return await off_loop_if(
        many, lambda: _tokenize_answer(model, answer, body.return_token_strs, many)
    )


def _tokenize_answer(
    model: ModelHandle, answer: dict[str, Any], strings: bool, many: bool
) -> dict[str, Any] | bytes:
    """The answer, with ``token_strs`` when asked; many ids come back serialized already,
    in pieces (``json_in_pieces``), so that no single call holds the GIL for long."""
    if strings:
        # vLLM's token_strs: each id's vocabulary entry (e.g. "Ġworld"), not decoded text.
        to_token = model.tokenizer.id_to_token
        answer["token_strs"] = [to_token(token) or "" for token in answer["tokens"]]
    return json_in_pieces(answer) if many else answer


def chat_prompt_ids(model: ModelHandle, body: TokenizeChatRequest) -> list[int]:
    """The conversation rendered and tokenized as the chat route does (pipeline/prompt.py)."""
    if any(kind == "video" for kind, _ in body.media_parts()):
        check_takes_video(model)
    text = render_chat(
        model, body.template_messages(), body.template_tools(), body.add_generation_prompt
    )
    if body.continue_final_message:
        text = open_final_message(text, body.final_text())
    return encode_ids(model.tokenizer, text, body.add_special_tokens)


def open_final_message(rendered: str, final: str | None) -> str:
    """The rendered chat cut right after the final message's text, so that the model
    continues that message instead of ending it (what transformers and vLLM do).

    The cut is at the last place the message's text appears; the message's trailing
    whitespace is kept where the template kept it.
    """
    if final is None:
        raise make_error(
            "invalid_request",
            "continue_final_message needs a final message with text content to continue",
            param="messages",
        )
    core = final.strip()
    at = rendered.rfind(core)
    if at < 0:
        raise make_error(
            "invalid_request",
            "continue_final_message: the model's chat template does not render the final "
            "message's text as written, so the message cannot be left open",
            param="continue_final_message",
        )
    return rendered[: at + (len(final) if rendered.startswith(final, at) else len(core))]


async def expand_images(
    state: GatewayState, model: ModelHandle, ids: list[int], parts: list[tuple[str, str]]
) -> list[int]:
    """``ids`` with each image's and video's anchor expanded to that item's token run.

    ``parts``: ``(modality, url)`` in the order written. The checks, the fetch and the
    processing are the router path's (``pipeline/media.py``): the same refusals, the
    in-flight budget charged while the media are decoded, within ``--request-timeout-secs``.
    The caller holds the request's admission slot.
    """
    config = state.config
    workers = state.registry.workers(model_id=model.model_id)
    plan = checked_media_plan(model, parts, ids, workers, config)
    info = model.info
    lease = state.pixel_budget.lease()
    try:
        image_runs, video_runs = await media_in_time(
            config.request_timeout_s, _media_runs(state, model, plan, lease)
        )
    finally:
        lease.release()
    expanded, _, _ = expand_media(
        ids, info.anchor_token_id, image_runs, info.video_token_id, video_runs
    )
    return expanded


async def _media_runs(
    state: GatewayState, model: ModelHandle, plan: MediaPlan, lease: PixelLease
) -> tuple[list[list[int]], list[list[int]]]:
    """Each image's and video's token run, as the router path processes them."""
    config, info = state.config, model.info
    image_runs: list[list[int]] = []
    video_runs: list[list[int]] = []
    if plan.image_urls:
        assert model.processor is not None  # checked_media_plan refused otherwise
        processed = await process_images(
            plan,
            info,
            model.processor,
            config.media,
            lease=lease,
            pool=state.image_pool,
            cache=state.pixel_cache,
        )
        processed.pixel_values = None  # only the counts are needed
        image_runs = [[info.image_token_id] * n for n in processed.tokens_per_image]
    if plan.video_urls:
        assert model.video_processor is not None
        done = await process_videos(
            list(plan.video_urls),
            info,
            model.video_processor,
            config.media,
            model.encode,
            lease=lease,
        )
        video_runs = done.batch.replacements
    return image_runs, video_runs


async def _detokenize(state: GatewayState, inbound: HttpInbound) -> dict[str, Any]:
    raw = await inbound.read_body(state.config.max_payload_size)
    body = await parse_large_off_loop(raw, parse_detokenize_request)
    model = await served_model(state, body.model)
    tokens = body.tokens
    text = await off_loop_if(
        len(tokens) > INLINE_TOKENS, lambda: _checked_decode(model.tokenizer, tokens)
    )
    return {"prompt": text}


def _checked_decode(tokenizer: Tokenizer, tokens: list[int]) -> str:
    unknown = [token for token in tokens if tokenizer.id_to_token(token) is None]
    if unknown:
        raise make_error(
            "invalid_request",
            f"token ids {unknown[:5]} are outside the vocabulary "
            f"({tokenizer.get_vocab_size(with_added_tokens=True)} tokens)",
            param="tokens",
        )
    return decode_ids(tokenizer, tokens, skip_special_tokens=False)
