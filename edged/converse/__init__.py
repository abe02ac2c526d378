"""`edged converse`: the listening half of a conversation, on the daemon (docs/converse.md)."""
