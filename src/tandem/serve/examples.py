"""The ready banner of `tandem serve`: where to connect, and two examples that send an image.

The examples are printed with the absolute path of the shipped picture, so that pasting
them from any directory works. The Python one sits between fixed markers so that tests
(and scripts) can cut it out of the output and run it as is.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tandem.engine.builtin_shapes import answer, draw

# src/tandem/serve/examples.py → the repository root is three levels above this package.
REPO_IMAGE = Path(__file__).resolve().parents[3] / "assets" / "example.png"
PYTHON_BEGIN = "--- python example ---"
CURL_BEGIN = "--- curl example ---"
END = "--- end ---"
PROMPT = "What is in this picture?"
MAX_TOKENS = 32
# Greedy, so the reply is the one the banner promises: sampled at the API's default
# temperature 1, a tiny model now and then picks an unlikely byte ("a red \ufffde circle").
TEMPERATURE = 0
EXAMPLE_SHAPE = ("red", "circle")  # what assets/example.png shows
EXPECTED_REPLY = answer(*EXAMPLE_SHAPE)  # what the built-in models say of it


def draw_example_image(path: Path) -> Path:
    """Draw the example picture (a red circle on white, 128×128) as a small palette PNG.

    It is one of the pictures the built-in models were trained on (engine/builtin_shapes.py),
    so they answer it with :data:`EXPECTED_REPLY`.
    """
    from PIL import Image

    picture = draw(*EXAMPLE_SHAPE, size=(128, 128))
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.image.convert("P", palette=Image.Palette.ADAPTIVE, colors=8).save(path, optimize=True)
    return path


def example_image(cache_root: Path) -> Path:
    """The shipped picture; an installed (non-checkout) copy draws the same one once."""
    if REPO_IMAGE.is_file():
        return REPO_IMAGE
    fallback = cache_root / "example.png"
    return fallback if fallback.is_file() else draw_example_image(fallback)


def _literal(text: str) -> str:
    # A JSON string is also a valid Python (and JSON body) literal, always double-quoted.
    return json.dumps(text)


def python_example(base_url: str, model: str, image: Path) -> str:
    return f"""import base64
from pathlib import Path

from openai import OpenAI

client = OpenAI(base_url={_literal(base_url + "/v1")}, api_key="unused")
image = base64.b64encode(Path({_literal(str(image))}).read_bytes()).decode()
reply = client.chat.completions.create(
    model={_literal(model)},
    max_tokens={MAX_TOKENS},
    temperature={TEMPERATURE},
    messages=[
        {{
            "role": "user",
            "content": [
                {{"type": "image_url", "image_url": {{"url": f"data:image/png;base64,{{image}}"}}}},
                {{"type": "text", "text": {_literal(PROMPT)}}},
            ],
        }}
    ],
)
print(reply.choices[0].message.content)"""


def curl_example(base_url: str, model: str, image: Path) -> str:
    # An unquoted heredoc lets the shell splice the base64 in; `base64 < FILE | tr -d`
    # behaves the same with GNU and BSD base64 (BSD has no -w0).
    encoded = f"$(base64 < {shlex.quote(str(image))} | tr -d '\\n')"
    return f"""curl -s {base_url}/v1/chat/completions \\
  -H 'Content-Type: application/json' -d @- <<EOF
{{"model": {_literal(model)}, "max_tokens": {MAX_TOKENS}, "temperature": {TEMPERATURE},
 "messages": [{{"role": "user", "content": [
  {{"type": "image_url", "image_url": {{"url": "data:image/png;base64,{encoded}"}}}},
  {{"type": "text", "text": {_literal(PROMPT)}}}]}}]}}
EOF"""


def banner(
    base_url: str, model: str, image: Path, notes: list[str], expected: str | None = None
) -> str:
    """``expected``: the reply the model gives to the examples, when it is known."""
    reply = [f"Both examples print the model's reply; expect {expected!r}.", ""] if expected else []
    lines = [
        "",
        f"Tandem is ready at {base_url} (OpenAI API under {base_url}/v1), model {model}",
        *(f"note: {note}" for note in notes),
        "",
        CURL_BEGIN,
        curl_example(base_url, model, image),
        END,
        "",
        PYTHON_BEGIN,
        python_example(base_url, model, image),
        END,
        "",
        *reply,
        "Press Ctrl-C to stop every process.",
        "",
    ]
    return "\n".join(lines)


def extract(output: str, begin: str) -> str:
    """The text between ``begin`` and the next END marker in ``output``."""
    start = output.index(begin) + len(begin)
    return output[start : output.index(END, start)].strip("\n")
