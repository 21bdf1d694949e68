"""FederatedCorpus (user -> examples) and the loaders that build one from real sources."""

from fedpriv.data.corpus import FederatedCorpus
from fedpriv.data.examples import TaggedExample, TextExample
from fedpriv.data.sources import open_corpus

__all__ = ["FederatedCorpus", "TaggedExample", "TextExample", "open_corpus"]
