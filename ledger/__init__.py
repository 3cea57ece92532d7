"""gridledger ledger package."""
