"""``tandem gateway --processes N``: N gateway processes serving one port.

A small supervisor (:mod:`.supervisor`) starts N children, each a whole gateway with its
own event loop, worker clients and health checks, each binding its own SO_REUSEPORT
socket on the same host and port, so that the kernel spreads new connections over them.
What must behave as one gateway is shared out (:mod:`.shared_limits`: admission limits,
the pixel budget, the image pool) or aggregated (:mod:`.metrics_dir`: one ``/metrics``).
``--processes 1`` (the default) starts none of this.
"""
