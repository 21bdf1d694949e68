"""Word vocabularies for NWP (and, in later modules, DP histograms and subword vocabularies)."""
