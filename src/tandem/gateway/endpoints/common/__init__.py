"""Schema pieces the OpenAI endpoints share: sampling fields, messages, tools, output
constraints, refusals by name, the pydantic-error mapper, OpenAI's response bodies."""
