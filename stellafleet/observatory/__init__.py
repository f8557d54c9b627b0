"""`stella observatory`: a local web dashboard over the fleet ledger."""
