"""Tandem: a prefill/decode-disaggregated gateway and CPU worker for vision-language models."""

__version__ = "0.1.0"
