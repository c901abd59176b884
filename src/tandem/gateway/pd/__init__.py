"""Prefill/decode (PD) dispatch for the gateway.

The pure decisions live in small modules the dispatchers build on:

- :mod:`.forms`: which decode-leg form a request takes (Full, IdentityOnly,
  TextPlusHashes), the 400s for impossible pairings, and the guards that refuse
  to send a pixel-less image leg that has no KV to pull from;
- :mod:`.connector`: the prefill worker's KV connector mode, the KV tags of the
  prefill leg, gateway-minted transfer ids and the KV handoff to the decode leg;
- :mod:`.identity_relay`: replacing the decode leg's ``media_refs`` with the
  prefill worker's media identity, so worker-side media is processed once;
- :mod:`.fanout`: when and how a text request with n > 1 splits into n pairs.

Nothing here imports torch or touches the network.
"""
