"""The worker's TokenSpeed adapter: ``tokenspeed.grpc.scheduler.TokenSpeedScheduler`` over
Tandem's ``Engine``.

Everything that reads or writes TokenSpeed's messages on the worker side is here; PD meets
at TokenSpeed's KV bootstrap rooms over Tandem's KV side channel, as SGLang's does
(docs/architecture.md, "Add a worker protocol"). An encode worker (``--role encode``,
E/P/D) serves a discovery copy of the scheduler service (``discovery.py``).
"""
