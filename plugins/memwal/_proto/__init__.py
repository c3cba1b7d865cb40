"""Protobuf code generated from protos/ by `make proto`; never edited by hand."""
