"""gridledger meter package."""
