"""Stage: render the chat template and tokenize; collect the request's image URLs."""

from __future__ import annotations

from tandem.errors import make_error
from tandem.gateway.api.schemas import ChatCompletionRequest
from tandem.gateway.pipeline.context import RequestContext
from tandem.models.chat import ChatTemplateError


def build_prompt(ctx: RequestContext) -> None:
    model = ctx.model
    body = ctx.body
    if isinstance(body, ChatCompletionRequest):
        try:
            ctx.prompt_text = model.template.render(body.template_messages(), True)
        except ChatTemplateError as exc:
            raise make_error("invalid_request", f"chat template: {exc}", param="messages") from None
        ctx.prompt_ids = model.encode(ctx.prompt_text)
        ctx.image_urls = body.image_urls()
    elif isinstance(body.prompt, str):
        ctx.prompt_text = body.prompt
        ctx.prompt_ids = model.encode(body.prompt)
    else:
        vocab = model.info.vocab_size
        bad = [t for t in body.prompt if not 0 <= t < vocab]
        if bad:
            raise make_error(
                "invalid_request",
                f"prompt token ids {bad[:5]} are outside the vocabulary",
                param="prompt",
            )
        ctx.prompt_ids = list(body.prompt)
    if not ctx.prompt_ids:
        raise make_error("invalid_request", "the prompt is empty", param="messages")
    limit = model.info.max_context
    if limit and len(ctx.prompt_ids) >= limit:
        raise make_error(
            "invalid_request",
            f"the prompt has {len(ctx.prompt_ids)} tokens; the model's context is {limit}",
            param="messages",
        )
