"""The synthetic pictures the built-in models learn from: what they show is what they say."""

from __future__ import annotations

import json
import random

import pytest

from tandem.engine.builtin_shapes import (
    COLOURS,
    SHAPES,
    TEXT_ONLY_REPLY,
    answer,
    draw,
    json_answer,
    random_picture,
)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("colour", list(COLOURS))
def test_the_shape_is_drawn_in_its_colour_on_a_contrasting_background(
    colour: str, shape: str
) -> None:
    rng = random.Random(f"{colour}-{shape}")
    picture = draw(colour, shape, (120, 100), rng)
    image = picture.image
    centre = image.getpixel((60, 50 + 5))  # a triangle's centroid sits below the box centre
    corner = image.getpixel((0, 0))
    assert all(abs(c - e) <= 12 for c, e in zip(centre, COLOURS[colour], strict=True))
    assert sum(abs(c - b) for c, b in zip(COLOURS[colour], corner, strict=True)) >= 150
    assert picture.answer == answer(colour, shape) == f"a {colour} {shape}"


def test_shapes_differ_where_they_should() -> None:
    """Same colour, size and (plain) placement: a square fills its box's corners, a circle
    and a triangle do not, and a triangle's top corners are background."""
    pictures = {s: draw("blue", s, (128, 128)).image for s in SHAPES}
    near_corner = (64 - 40, 64 - 40)  # inside the square's box (radius 0.35 * 128 ≈ 44.8)
    assert pictures["square"].getpixel(near_corner) != pictures["circle"].getpixel(near_corner)
    top_left_of_top = (64 - 30, 64 - 40)
    assert pictures["triangle"].getpixel(top_left_of_top) != COLOURS["blue"]


def test_drawing_is_seeded() -> None:
    first = random_picture(random.Random(5), (96, 160))
    again = random_picture(random.Random(5), (96, 160))
    other = random_picture(random.Random(6), (96, 160))
    assert first.png() == again.png() and first.png() != other.png()
    assert min(first.image.size) >= 96 and max(first.image.size) <= 160


def test_json_answers() -> None:
    assert json.loads(json_answer("red", "circle")) == {"color": "red", "shape": "circle"}
    assert json.loads(json_answer(None, None)) == {"reply": TEXT_ONLY_REPLY}


def test_unknown_colour_or_shape() -> None:
    with pytest.raises(ValueError):
        draw("pink", "circle")
    with pytest.raises(ValueError):
        draw("red", "hexagon")
