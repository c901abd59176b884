"""The gateway: OpenAI HTTP in front, vLLM-protocol gRPC workers behind."""
