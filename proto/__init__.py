"""gridledger proto package."""
