"""Mutex_Package.zip: the package format (format), drivers.toml (manifest), the build, and the install."""
