"""The Flower engine, its pieces together: the strategy over the shared server core
(:mod:`.strategy`), the ServerApp and ClientApp (:mod:`.apps`), the local simulation
(:mod:`.simulation`) and a deployment on loopback (:mod:`.deploy`)."""
