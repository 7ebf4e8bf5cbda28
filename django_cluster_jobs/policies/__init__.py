"""Pure policy decisions: no database and no clock; the ledger and the engine apply them."""
