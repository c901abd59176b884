"""The vLLM gRPC engine contract as Tandem uses it: proto modules, tensor codec, request helpers."""
