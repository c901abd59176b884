"""Prefill/decode (PD) dispatch for the gateway, whatever the workers' protocol.

- :mod:`.dispatcher`: a pair per request (``selection.py``), retries, and the n > 1 fan-out
  merged into one stream (``merge.py``); the backend opens each pair its protocol's way
  (vLLM's decode-leg forms, KV connectors, identity relay and flows:
  ``gateway/backends/vllm/``);
- :mod:`.deferred_abort`: a decode leg abandoned during its KV pull is aborted after it.

Nothing here imports torch or touches the network.
"""
