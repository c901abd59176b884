"""One folder per client API: its schema, its conversion into the pipeline's request, its
rendering of the pipeline's answer, its routes (docs/architecture.md). ``common`` holds the
pydantic pieces the OpenAI dialects share."""
