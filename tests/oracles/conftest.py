"""Fixtures of the oracle tests: `backend` (numpy, and cupy where a GPU is) and
`make_mgr`, defined once in `tests/impl_helpers.py`."""

from impl_helpers import backend, make_mgr  # noqa: F401  (pytest takes fixtures from here)
