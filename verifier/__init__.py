"""gridledger verifier package."""
