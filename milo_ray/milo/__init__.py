"""milo package."""
