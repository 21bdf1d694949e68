"""The experiment runner, above everything else: experiment grids (:mod:`.grid`), preparing an
experiment's data (:mod:`.prepare`, with the ``[privatize]`` stage :mod:`.privatize` and run
embedding spaces :mod:`.embeddings`), the one engine dispatch (:mod:`.dispatch`), the run store
(:mod:`.store`), run summaries (:mod:`.summary`), audit orchestration (:mod:`.audit`), the
``[[measure]]`` entries (:mod:`.measure`) and the apps ``flwr run .`` loads (:mod:`.flower_app`)."""
