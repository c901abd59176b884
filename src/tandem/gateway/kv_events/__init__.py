"""Routing from the workers' own KV events (issue 36): content keys, the index, one
subscription per worker and the manager that follows the worker registry.

See ``docs/architecture.md`` and the ``kv_events`` policy
(``gateway/workers/policies/kv_events.py``).
"""

from tandem.gateway.kv_events.index import KvEventIndex
from tandem.gateway.kv_events.keys import block_key, request_keys
from tandem.gateway.kv_events.manager import KvEventManager

__all__ = ["KvEventIndex", "KvEventManager", "block_key", "request_keys"]
