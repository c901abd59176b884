"""What the scheduler-shaped protocols (SGLang, TokenSpeed) share on the gateway side:
frames, constraint fields, the client's calls, the sender and the backend's media and
fan-out. Neither protocol's messages are imported here."""
