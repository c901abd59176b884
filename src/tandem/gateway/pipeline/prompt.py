"""Stage: render the chat template and tokenize; collect the request's image URLs."""

from __future__ import annotations

from typing import Any

from tandem.errors import TandemError, make_error
from tandem.gateway.context import RequestContext
from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.generation_request import ChatPrompt, GenerationRequest
from tandem.gateway.tokenizing import INLINE_CHARS, TooManyTokens, more_text_than, off_loop_if
from tandem.models.chat import ChatTemplateError


async def prepare_prompt(ctx: RequestContext) -> None:
    """:func:`build_prompt`, off the event loop when the text to render is long."""
    await off_loop_if(long_prompt(ctx.request), lambda: build_prompt(ctx))


def long_prompt(request: GenerationRequest) -> bool:
    """Whether rendering and tokenizing should leave the event loop: every string the
    template renders counts (tool-call arguments, tool definitions, reasoning…)."""
    prompt = request.prompt
    if isinstance(prompt, ChatPrompt):
        return more_text_than([prompt.messages, prompt.template_tools])
    return len(prompt) > INLINE_CHARS


def render_chat(
    model: ModelHandle,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool = True,
) -> str:
    """The conversation as the model's chat template writes it (also for /tokenize)."""
    if tools is not None and not model.template.renders_tools:
        # The model would never see the tools: refuse rather than answer as if it had.
        raise make_error(
            "unsupported_parameter",
            f"the chat template of {model.model_id} does not render tools: remove 'tools'",
            param="tools",
        )
    try:
        return model.template.render(messages, add_generation_prompt, tools=tools)
    except ChatTemplateError as exc:
        raise make_error("invalid_request", f"chat template: {exc}", param="messages") from None


def check_takes_video(model: ModelHandle) -> None:
    """400 ``multimodal_not_supported`` naming the modality, for a model without video."""
    if model.video_processor is None:
        raise make_error(
            "multimodal_not_supported",
            f"video input is not supported by model {model.model_id!r} "
            f"({model.info.family.name} takes images only): remove the video_url part(s)",
        )


def build_prompt(ctx: RequestContext) -> None:
    try:
        _build_prompt(ctx)
    except TooManyTokens as over:
        # Counted, never listed: the ids of a prompt this long are not needed.
        raise _over_context(over.count, ctx.model.info.max_context) from None


def _over_context(count: int, limit: int) -> TandemError:
    return make_error(
        "invalid_request",
        f"the prompt has {count} tokens; the model's context is {limit}",
        param="messages",
    )


def _build_prompt(ctx: RequestContext) -> None:
    model = ctx.model
    request = ctx.request
    prompt = request.prompt
    # A prompt of the whole context or more is refused below; its count is enough for that.
    at_most = model.info.max_context - 1 if model.info.max_context else None
    if isinstance(prompt, ChatPrompt):
        ctx.media_kinds = [kind for kind, _ in prompt.media]
        ctx.media_urls = [url for _, url in prompt.media]
        if "video" in ctx.media_kinds:
            check_takes_video(model)  # before the template, which may not know video parts
        ctx.prompt_text = render_chat(model, prompt.messages, prompt.template_tools)
        ctx.prompt_ids = model.encode(ctx.prompt_text, at_most)
    elif isinstance(prompt, str):
        ctx.prompt_text = prompt
        ctx.prompt_ids = model.encode(prompt, at_most)
    else:
        vocab = model.info.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise make_error(
                "invalid_request",
                f"prompt token ids {bad[:5]} are outside the vocabulary",
                param="prompt",
            )
        ctx.prompt_ids = list(prompt)
    if not ctx.prompt_ids:
        raise make_error("invalid_request", "the prompt is empty", param="messages")
    limit = model.info.max_context
    if limit and len(ctx.prompt_ids) >= limit:
        raise _over_context(len(ctx.prompt_ids), limit)
    wanted = request.sampling.max_tokens
    if limit and wanted is not None and len(ctx.prompt_ids) + wanted > limit:
        # Refused as vLLM and OpenAI do, rather than clamped: the client asked for more
        # than can ever come (images, expanded later, only make the prompt longer).
        raise make_error(
            "invalid_request",
            f"the prompt's {len(ctx.prompt_ids)} tokens and the {wanted} output tokens asked "
            f"for exceed the model's context of {limit} tokens",
            param=request.output_limit_param,
        )
