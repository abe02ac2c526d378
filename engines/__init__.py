"""The engine toolchain: checkpoints -> artifacts (needs the `export` extra); never imported by `edged`."""
