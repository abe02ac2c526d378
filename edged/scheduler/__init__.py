"""Request slots, admission, the cohort loop, cancellation and finish reasons."""
