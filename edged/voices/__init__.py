"""Enrolled voices: cloned once from a reference recording, kept in SQLite, spoken by name.

`store` is the database (one row per voice, bound to the artifact that encoded it); `book` is what
the server thread reads to resolve `speak.voice`; `service` is the thread that encodes references on
its own engines (off the cohort loop) and answers `voice_add`, `voice_remove` and `voices`."""
