"""The synthetic picture world the built-in models are trained on: one coloured shape on a
plain background, and the short answer that names it ("a red circle").

Torch-free (Pillow only), so tests and examples can draw the same pictures the generator
trains on; a held-out set is just another seed. The README section "What the built-in
models can and cannot do" says what the trained models answer.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (235, 210, 30),
    "purple": (140, 40, 170),
    "orange": (245, 140, 20),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
BACKGROUNDS: tuple[tuple[int, int, int], ...] = (
    (255, 255, 255),
    (128, 128, 128),
    (200, 190, 170),
    (90, 110, 130),
    (170, 200, 200),
)
# Questions an image comes with in training; any other wording gets the same kind of answer.
IMAGE_QUESTIONS: tuple[str, ...] = (
    "What is in this picture?",
    "What is in the picture?",
    "What do you see?",
    "Describe the image.",
    "Describe this picture.",
    "What shape is this?",
    "What colour is the shape?",
    "What is shown here?",
    "What is this?",
    "",
)
# A prompt without an image gets this reply: the models know only pictures of shapes.
TEXT_ONLY_REPLY = "Show me a picture."
# Asked for JSON, they answer in JSON: so a JSON schema (response_format) is filled in
# instead of looping on the whitespace JSON allows, which a model that never saw "{" does.
JSON_QUESTIONS: tuple[str, ...] = (
    "Reply with a JSON object naming the colour.",
    "Answer in JSON.",
    "What is in this picture? Reply in JSON.",
    "Describe the image as JSON.",
    "Give me JSON.",
)
_TEXT_WORDS = (
    "hello", "please", "tell", "me", "about", "the", "weather", "a", "story", "count", "to",
    "ten", "why", "is", "sky", "what", "time", "write", "poem", "list", "three", "numbers",
)  # fmt: skip
_MIN_CONTRAST = 150  # summed channel distance between a shape and its background
_JITTER = 12  # per-channel colour noise, so a colour is a range and not one value
# How far the shape's centre may wander from the picture's, as a share of each side. The
# tiny models tell shapes apart reliably only near the centre (anywhere is much harder).
_WANDER = 0.06


def answer(colour: str, shape: str) -> str:
    """The answer the models are trained to give for a picture of this shape."""
    return f"a {colour} {shape}"


def json_answer(colour: str | None, shape: str | None) -> str:
    """The answer to a JSON question: the picture's colour and shape, or (no picture) the
    text-only reply under a key of its own."""
    if colour is None or shape is None:
        return json.dumps({"reply": TEXT_ONLY_REPLY})
    return json.dumps({"color": colour, "shape": shape})


@dataclass(frozen=True, slots=True)
class ShapePicture:
    colour: str
    shape: str
    image: Image.Image

    @property
    def answer(self) -> str:
        return answer(self.colour, self.shape)

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.image.save(buffer, format="PNG")
        return buffer.getvalue()


def draw(
    colour: str,
    shape: str,
    size: tuple[int, int] = (96, 96),
    rng: random.Random | None = None,
) -> ShapePicture:
    """One picture: the shape filled with the colour (jittered), on a contrasting background.

    Without ``rng`` the picture is the plain one: centred, grey or white background.
    """
    if colour not in COLOURS or shape not in SHAPES:
        raise ValueError(f"unknown colour/shape {colour!r}/{shape!r}")
    width, height = size
    fill: tuple[int, ...] = COLOURS[colour]
    backs = [b for b in BACKGROUNDS if _distance(b, fill) >= _MIN_CONTRAST]
    if rng is None:
        back, scale, cx, cy = backs[0], 0.35, width / 2, height / 2
    else:
        back = rng.choice(backs)
        fill = tuple(min(255, max(0, v + rng.randint(-_JITTER, _JITTER))) for v in fill)
        scale = rng.uniform(0.28, 0.4)
    r = scale * min(width, height)
    if rng is not None:
        cx = _wander(rng, width, r)
        cy = _wander(rng, height, r)
    image = Image.new("RGB", (width, height), back)
    pen = ImageDraw.Draw(image)
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    return ShapePicture(colour, shape, image)


def _distance(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def _wander(rng: random.Random, side: int, radius: float) -> float:
    centre = side / 2 + rng.uniform(-_WANDER, _WANDER) * side
    return min(max(centre, radius), side - radius)


def random_picture(rng: random.Random, sizes: tuple[int, int]) -> ShapePicture:
    """A random colour and shape, each side drawn from ``sizes`` = (smallest, largest)."""
    colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    size = (rng.randint(*sizes), rng.randint(*sizes))
    return draw(colour, shape, size, rng)


def random_text_prompt(rng: random.Random) -> str:
    """A text-only prompt of a few words (answered with ``TEXT_ONLY_REPLY``)."""
    words = rng.choices(_TEXT_WORDS, k=rng.randint(1, 8))
    return " ".join(words).capitalize() + rng.choice(("?", ".", "!", ""))
