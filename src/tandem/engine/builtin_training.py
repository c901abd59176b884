"""Offline training of a built-in model on the synthetic shapes (engine/builtin_shapes.py),
as pictures and, for a model that takes video, as short clips (engine/builtin_clips.py).

Runs once, when the checkpoint is generated: a fixed number of AdamW steps from the seeded
initialisation, on batches drawn from a seeded generator, with a fixed thread count, so the
same machine always writes the same weights. The prompts are rendered with the checkpoint's
own chat template, tokenizer and image processor, the very files the gateway uses, so what
the model learns is what a client's request looks like on the wire.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer
from tqdm import tqdm

from tandem.engine.builtin_clips import shifted
from tandem.engine.builtin_shapes import (
    IMAGE_QUESTIONS,
    JSON_QUESTIONS,
    TEXT_ONLY_REPLY,
    json_answer,
    random_picture,
    random_text_prompt,
)
from tandem.engine.builtin_specs import BuiltinSpec, TrainingRecipe
from tandem.models.chat import ChatTemplate
from tandem.models.info import ModelInfo, load_model_info
from tandem.models.placeholders import expand_media, expand_placeholders
from tandem.models.processor import ImageProcessor, load_processor
from tandem.models.video import load_video_processor, video_replacement

_IGNORE = -100  # label of a position that is not trained (the prompt, padding)


@dataclass(slots=True)
class _Example:
    prompt: list[int]  # expanded: one image (or video) token per feature
    reply: list[int]  # the answer and the template's end-of-turn token
    pixels: np.ndarray | None
    grid: np.ndarray | None
    video: bool = False  # pixels and grid are a clip's (pixel_values_videos, video_grid_thw)


class _Examples:
    """Draws training examples through the checkpoint's template, tokenizer and processor."""

    def __init__(self, directory: Path, spec: BuiltinSpec, recipe: TrainingRecipe) -> None:
        self.info: ModelInfo = load_model_info(directory, spec.name)
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._template = ChatTemplate.from_model_dir(directory)
        self._processor: ImageProcessor = load_processor(directory, spec.name)
        self._video = load_video_processor(
            directory, self.info.takes_video and recipe.video_fraction > 0
        )
        self._recipe = recipe

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def _turn(self, content: list[dict[str, str]], reply: str) -> tuple[list[int], list[int]]:
        # The reply's tokens are what the template writes after the generation prompt, up to
        # and including its end-of-turn token: the stop token the engine will see.
        user = [{"role": "user", "content": content}]
        prompt = self._template.render(user, add_generation_prompt=True)
        full = self._template.render(
            [*user, {"role": "assistant", "content": reply}], add_generation_prompt=False
        )
        if not full.startswith(prompt):
            raise RuntimeError("the chat template does not extend its generation prompt")
        tail = self._encode(full[len(prompt) :])
        stops = set(self.info.eos_token_ids)
        end = next((i for i, t in enumerate(tail) if t in stops), None)
        if end is None:
            raise RuntimeError("the chat template writes no end-of-turn token after a reply")
        return self._encode(prompt), tail[: end + 1]

    def draw(self, rng: random.Random, clip: bool = False) -> _Example:
        """A text, picture or (``clip``) video example."""
        in_json = rng.random() < self._recipe.json_fraction
        if not clip and rng.random() < self._recipe.text_fraction:
            text = rng.choice(JSON_QUESTIONS) if in_json else random_text_prompt(rng)
            reply = json_answer(None, None) if in_json else TEXT_ONLY_REPLY
            prompt, tokens = self._turn([{"type": "text", "text": text}], reply)
            return _Example(prompt, tokens, None, None)
        picture = random_picture(rng, self._recipe.image_sides)
        question = rng.choice(JSON_QUESTIONS if in_json else IMAGE_QUESTIONS)
        video = clip and self._video is not None
        kind = "video" if video else "image"
        parts = [{"type": kind}] + ([{"type": "text", "text": question}] if question else [])
        if rng.random() < 0.25:
            parts.reverse()  # the question before the image, as some clients write it
        reply = json_answer(picture.colour, picture.shape) if in_json else picture.answer
        prompt, tokens = self._turn(parts, reply)
        if video:
            return self._clip_example(rng, picture.image, prompt, tokens)
        pre = self._processor.preprocess([picture.image])
        info = self.info
        expanded, _ = expand_placeholders(
            prompt, info.anchor_token_id, pre.tokens_per_image, info.image_token_id
        )
        grid = pre.grids.get("image_grid_thw")
        return _Example(expanded, tokens, pre.pixel_values, grid)

    def _clip_example(
        self, rng: random.Random, image: Image.Image, prompt: list[int], reply: list[int]
    ) -> _Example:
        """The picture as a short clip (the shape drifting), sampled as the gateway samples."""
        video = self._video
        assert video is not None
        total, fps, drift = rng.randint(4, 12), rng.choice((2, 4, 8, 25)), rng.randint(0, 3)
        sampling = video.sample_frames(total, float(fps))
        frames = np.stack([np.asarray(shifted(image, k * drift)) for k in sampling.indices])
        pre = video.preprocess(frames, sampling, raw=False)
        info = self.info
        assert info.vision_start_id is not None and info.vision_end_id is not None
        assert info.video_token_id is not None
        run = video_replacement(
            pre, self._encode, info.vision_start_id, info.vision_end_id, info.video_token_id
        )
        expanded, _, _ = expand_media(prompt, info.anchor_token_id, [], info.video_token_id, [run])
        return _Example(expanded, reply, pre.pixel_values, pre.grid, video=True)


def _batch(examples: list[_Example], pad_id: int, qwen: bool) -> dict[str, torch.Tensor]:
    length = max(len(e.prompt) + len(e.reply) for e in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), length), _IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        sequence = example.prompt + example.reply
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
        labels[row, len(example.prompt) : len(sequence)] = torch.tensor(example.reply)
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    for video, pixels_key, grid_key in (
        (False, "pixel_values", "image_grid_thw"),
        (True, "pixel_values_videos", "video_grid_thw"),
    ):
        items = [e for e in examples if e.pixels is not None and e.video == video]
        if not items:
            continue
        batch[pixels_key] = torch.from_numpy(np.concatenate([e.pixels for e in items]))
        if qwen:
            grids = [e.grid for e in items if e.grid is not None]
            batch[grid_key] = torch.from_numpy(np.concatenate(grids))
    return batch


def train(model: torch.nn.Module, directory: Path, spec: BuiltinSpec) -> None:
    """Train ``model`` in place on the spec's recipe; ``directory`` holds its other files."""
    recipe = spec.training
    if recipe is None:
        return
    examples = _Examples(directory, spec, recipe)
    info = examples.info
    qwen = info.family.has_mrope
    pad_id = spec.token_id(str(spec.tokenizer_config["pad_token"]))
    rng = random.Random(recipe.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)  # float sums depend on how the work is split
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    model.train()
    bar = tqdm(
        total=recipe.steps,
        desc=f"tandem: training {spec.name}",
        file=sys.stderr,
        mininterval=1.0 if sys.stderr.isatty() else 15.0,
        unit="step",
    )
    try:
        for step in range(recipe.steps):
            warm = min(1.0, (step + 1) / recipe.warmup_steps)
            decay = max(0.05, 1.0 - step / recipe.steps)
            for group in optimizer.param_groups:
                group["lr"] = recipe.lr * warm * decay
            # Clips come in batches of their own: their prompts are several times longer,
            # and a batch is padded to its longest prompt.
            clips = recipe.video_fraction > 0 and step % round(1 / recipe.video_fraction) == 1
            drawn = [examples.draw(rng, clips) for _ in range(recipe.batch)]
            batch = _batch(drawn, pad_id, qwen)
            if qwen:
                # Qwen3-VL's forward tells image (1) and video (2) tokens from text (0).
                ids = batch["input_ids"]
                types = (ids == info.image_token_id).long()
                if info.video_token_id is not None:
                    types += 2 * (ids == info.video_token_id).long()
                batch["mm_token_type_ids"] = types
            loss = model(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            bar.update()
    finally:
        bar.close()
        torch.set_num_threads(threads)
    model.eval()
