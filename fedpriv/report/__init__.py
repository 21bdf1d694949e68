"""The report, read-only: tables (:mod:`.tables`), plots (:mod:`.plots`), the privacy of BERT
chains (:mod:`.chain`) and the ``[[measure]]`` records (:mod:`.measurements`), all read from run
stores and run directories; nothing here trains."""
