"""Conversation history: the turn store and the heard-text arithmetic over spoken replies."""
