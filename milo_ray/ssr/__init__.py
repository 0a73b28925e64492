"""ssr package."""
