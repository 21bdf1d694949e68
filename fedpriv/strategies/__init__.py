"""The server side of federated training: cohort sampling (:mod:`.sampling`), composed
aggregators (:mod:`.aggregators`: weighted or clipped mean, Gaussian noise, adaptive clipping),
and the server core every engine shares (:mod:`.server`: aggregator, server optimizer, DP budget)."""
