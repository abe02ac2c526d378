"""The front doors: `edged wyoming` (Home Assistant) and `edged http` (OpenAI's speech API), separate
processes that reach the daemon as clients over its ZeroMQ protocol (edged/doors/link.py)."""
