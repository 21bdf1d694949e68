"""Memorization audits: canaries, Random Sampling, Beam Search, exposure, extraction."""
