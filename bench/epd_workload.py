"""The workload of ``bench.epd_reuse``: multi-turn image chats where images come back.

``conversations`` chats of ``turns`` user turns each, sent one request after another in the
order conversation 0 turn 1, conversation 1 turn 1, …, conversation 0 turn 2, … (as several
users chatting at once would). Every user turn brings one image: with probability ``reuse``
(0.8) one already seen earlier in the run (uniformly among the pool's images that this
conversation does not hold yet, so a chat never shows the same picture twice), else a new
one. New images are pictures of the built-in models' world (``builtin_shapes.draw``): each
takes the next colour × shape pair of a seeded shuffle of all 18 and its own size, and a new
image's PNG is never byte-equal to an earlier one. Each request carries the whole history,
every earlier turn with its image and the assistant's real answer, as a chat client does.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import random
from dataclasses import dataclass, field

from tandem.engine.builtin_shapes import COLOURS, IMAGE_QUESTIONS, SHAPES, draw

QUESTIONS = tuple(q for q in IMAGE_QUESTIONS if q)
CONVERSATIONS, TURNS = 24, 8  # the bench's defaults
SIDES = (64, 256)  # smallest and largest side of a new image (the model's budget is 256²)


@dataclass(frozen=True)
class Image:
    index: int  # order of first appearance in the run
    colour: str
    shape: str
    size: tuple[int, int]
    png: bytes

    @property
    def url(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode()


@dataclass(frozen=True)
class Turn:
    conversation: int
    turn: int  # 0-based
    image: int  # index into Workload.images
    reused: bool  # the image was seen earlier in the run
    question: str


@dataclass
class Workload:
    images: list[Image]
    order: list[Turn]  # the requests, in the order they are sent
    replies: dict[tuple[int, int], str] = field(default_factory=dict)  # (conv, turn) → answer

    def history(self, conversation: int) -> list[Turn]:
        return [t for t in self.order if t.conversation == conversation]

    def messages(self, request: Turn) -> list[dict]:
        """The chat sent for ``request``: every earlier turn with its answer, then this one."""
        out: list[dict] = []
        for t in self.history(request.conversation)[: request.turn + 1]:
            image = {"type": "image_url", "image_url": {"url": self.images[t.image].url}}
            out.append({"role": "user", "content": [image, {"type": "text", "text": t.question}]})
            if t.turn < request.turn:
                out.append({"role": "assistant", "content": self.replies[(t.conversation, t.turn)]})
        return out

    @property
    def reuse_rate(self) -> float:
        """Share of turns whose image was seen earlier in the run."""
        return sum(t.reused for t in self.order) / max(len(self.order), 1)


def _new_image(index: int, pairs: list[tuple[str, str]], rng: random.Random) -> Image:
    colour, shape = pairs[index % len(pairs)]
    size = (rng.randint(*SIDES), rng.randint(*SIDES))
    picture = draw(colour, shape, size, rng)
    return Image(index, colour, shape, size, picture.png())


def plan(conversations: int, turns: int, seed: int = 0, reuse: float = 0.8) -> Workload:
    """The seeded workload: same arguments, same images, same order, byte for byte."""
    rng = random.Random(seed)
    pairs = list(itertools.product(COLOURS, SHAPES))
    rng.shuffle(pairs)
    images: list[Image] = []
    digests: set[bytes] = set()
    held: dict[int, set[int]] = {c: set() for c in range(conversations)}
    order: list[Turn] = []
    for turn in range(turns):
        for conv in range(conversations):
            candidates = [i.index for i in images if i.index not in held[conv]]
            reused = bool(candidates) and rng.random() < reuse
            if reused:
                index = rng.choice(candidates)
            else:
                image = _new_image(len(images), pairs, rng)
                while hashlib.sha256(image.png).digest() in digests:
                    image = _new_image(len(images), pairs, rng)
                digests.add(hashlib.sha256(image.png).digest())
                images.append(image)
                index = image.index
            held[conv].add(index)
            question = QUESTIONS[(conv + turn) % len(QUESTIONS)]
            order.append(Turn(conv, turn, index, reused, question))
    return Workload(images, order)
