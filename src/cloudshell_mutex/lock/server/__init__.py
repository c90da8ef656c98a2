"""The one call and what its reply means: the calls on one alias, failures classified, late adds watched."""
