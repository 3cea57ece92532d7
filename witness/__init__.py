"""A party's witness of the ledger's log (SPEC.md §8.3): cosign only what extends its view.

Imports ``proto/`` only: a party runs it with its own key and its own copy of the terms,
trusting nothing the ledger says that it cannot check.
"""
