"""gridledger verifier: checks an export offline against a pinned trust file.

Imports ``proto/`` and libraries only, never ``ledger/``, ``meter/`` or ``gridledger/``
(tests/test_verifier_units.py enforces it). Public API:

* ``verifier.verify.verify_export(path, trust, *, pool=None, progress=None) -> ExportReport``
  — the checklist (1)-(9), see ``verifier/verify.py``: one module per step,
  ``step1_format.py`` to ``step9_obligation.py``, over one pass (``walk.py``);
* ``verifier.reconcile.reconcile(reports) -> Reconciliation`` — per party and currency;
* ``verifier.inclusion.make_inclusion_bundle(export, index, tree_size=None)``,
  ``proof_from_leaves(placement_id, leaves, index)`` and
  ``verify_inclusion_bundle(record_envelope, proof, note_text, trust)``;
* ``verifier.cli.register(subparsers)`` — ``gridledger verify``; ``python -m verifier``.
"""
