"""cohort."""
