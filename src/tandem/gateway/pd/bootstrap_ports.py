"""Where a PD (or E/P/D) data source meets its partners: the bootstrap port of a worker.

SGLang and TokenSpeed pair legs at a room on the source worker's bootstrap server, found
at (its host, its bootstrap port). The port is, in order: the one given after the URL on
the command line (``--prefill URL PORT``, ``--encode URL PORT``: smg's syntax), the one
the worker states in its labels, and the protocol's default, 8998
(docs/worker-protocols.md).
"""

from __future__ import annotations

from tandem.ascii_int import ascii_int
from tandem.gateway.workers.registry import normalize_url
from tandem.gateway.workers.worker import Worker

# The label both protocols' workers state their port under (SGLang's server_args name).
BOOTSTRAP_PORT_LABEL = "disaggregation_bootstrap_port"


class BootstrapPorts:
    """The bootstrap port of each source worker."""

    def __init__(self, given: dict[str, int | None] | None, default: int) -> None:
        # The ports given on the command line, by canonical worker address.
        self._given = {normalize_url(url): port for url, port in (given or {}).items()}
        self._default = default

    def port(self, worker: Worker) -> int:
        given = self._given.get(worker.url)
        if given is not None:
            return given
        stated = ascii_int(worker.labels.get(BOOTSTRAP_PORT_LABEL, ""))
        if stated is not None and 0 < stated < 65536:
            return stated
        return self._default
