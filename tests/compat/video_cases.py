"""What the vLLM lane sends with video: two clips of the same frame count and size and
different content, and a picture followed by a clip in one message."""

from __future__ import annotations

import base64

import openai

from tandem.engine.builtin_clips import shape_clip
from tandem.engine.builtin_shapes import draw

VIDEO_TEXT = "What is in this video?"


def _video(clip: bytes) -> dict:
    url = "data:video/mp4;base64," + base64.b64encode(clip).decode()
    return {"type": "video_url", "video_url": {"url": url}}


def _picture(colour: str, shape: str) -> dict:
    png = draw(colour, shape, (128, 96)).png()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return {"type": "image_url", "image_url": {"url": url}}


VIDEO_CASES: dict[str, list[dict]] = {
    "red circle clip": [_video(shape_clip("red", "circle"))],
    "blue square clip": [_video(shape_clip("blue", "square"))],
    "picture, then clip": [_picture("yellow", "triangle"), _video(shape_clip("green", "circle"))],
}


def ask_video(client: openai.OpenAI, model: str, parts: list[dict]) -> str:
    content = [*parts, {"type": "text", "text": VIDEO_TEXT}]
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=12, temperature=0
    )
    return reply.choices[0].message.content or ""
