"""Local privacy: d_chi-privacy (metric DP) mechanisms that privatize each token before it leaves
the user (Qu et al. 2021; Feyisetan et al. 2020; the Vickrey mechanism of Xu et al. 2021).

* :mod:`~fedpriv.privacy.local.mechanisms`: noise, M_rep, M_txt, Vickrey, sequences;
* :mod:`~fedpriv.privacy.local.embeddings`: the embedding space (and GloVe-style text files; a
  fedpriv run's space is read by :mod:`fedpriv.runner.embeddings`);
* :mod:`~fedpriv.privacy.local.corpus`: a corpus's users privatized user by user (``fedpriv
  privatize`` and the ``[privatize]`` stage, :mod:`fedpriv.runner.privatize`);
* :mod:`~fedpriv.privacy.local.measure`: plausible deniability statistics and embedding inversion.

See docs/local_privacy.md.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported lazily (PEP 562), so `fedpriv --help` and the CLI's start do not load JAX.
_WHERE = {
    "EmbeddingSpace": "embeddings",
    "load_glove": "embeddings",
    "TokenIndex": "mechanisms",
    "check_text_mechanism": "mechanisms",
    "guarantee_note": "mechanisms",
    "nearest_tokens": "mechanisms",
    "privatize_representations": "mechanisms",
    "privatize_streams": "mechanisms",
    "privatize_text": "mechanisms",
    "privatize_tokens": "mechanisms",
    "sample_noise": "mechanisms",
    "vickrey_probabilities": "mechanisms",
    "vickrey_select": "mechanisms",
    "vickrey_tokens": "mechanisms",
    "privatize_users": "corpus",
    "corpus_words": "measure",
    "plausible_deniability": "measure",
    "plot_deniability": "measure",
    "token_inversion": "measure",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"fedpriv.privacy.local.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EmbeddingSpace",
    "TokenIndex",
    "check_text_mechanism",
    "corpus_words",
    "guarantee_note",
    "load_glove",
    "nearest_tokens",
    "plausible_deniability",
    "plot_deniability",
    "privatize_representations",
    "privatize_streams",
    "privatize_text",
    "privatize_tokens",
    "privatize_users",
    "sample_noise",
    "token_inversion",
    "vickrey_probabilities",
    "vickrey_select",
    "vickrey_tokens",
]
