"""Portable ledger operations, written once over the ORM: settling, definition changes."""
