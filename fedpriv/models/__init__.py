"""Flax models: the NWP LSTM, the NER BiLSTM tagger and its linear-chain CRF."""
