"""Oracles that check the implementation's data from outside it.

`data.DecodeOracle` stamps every token's KV row and reads the window back through the page
tables after every step; `attention.AttentionOracle` compares paged sliding-window
attention with dense attention over the unpaged history. They read a manager's public
tables and the backend's arrays and check what a kernel would read, so they belong with
the verifiers, not in the manager (docs/architecture.md, "Where the oracles live").
"""
