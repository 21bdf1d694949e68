"""What every trainer shares: the one resumable loop (:mod:`.loop`), the one optimizer factory
(:mod:`.optimizers`) and the prepared experiment a trainer consumes (:mod:`.prepared`)."""
