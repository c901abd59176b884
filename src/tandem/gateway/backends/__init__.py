"""Worker protocols behind the gateway: neutral types here, one folder per protocol.

Everything outside a protocol's folder works on the neutral types (``frames.py``); only
the folder knows that protocol's messages (docs/architecture.md, "Worker protocols").
"""
