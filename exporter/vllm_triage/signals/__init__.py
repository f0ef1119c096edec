"""Signals: what the conditions judge, computed from a window of one source's readings. Pure
functions of the store and the clock, one module per source (as sources/ has): `window` holds the
window maths and the table machinery, `vllm`, `gpu` and `host` the tables.

A signal value of None means "cannot be computed" (metric absent, fewer than two frames in the
window, no observations for a quantile); conditions turn that into `unknown` or say why not.
"""
