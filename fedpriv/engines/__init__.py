"""Federated engines behind one small protocol (:mod:`.setup`: an engine runs a round): the
vectorized engine (:mod:`.vectorized`, the cohort in-process with JAX, a chunk at a time) and the
Flower engine (:mod:`.flower`); both run a group of users with the same jitted call
(:mod:`.cohort`) and finish rounds with the same server core."""
