"""The tiny transformers models and tokenizers are in :mod:`helpers.hf_fixtures`; this module re-exports them for
test files that still import ``from hf_fixtures import ...``: import from ``helpers.hf_fixtures`` instead, then
delete this module."""

from helpers.hf_fixtures import *  # noqa: F401,F403
