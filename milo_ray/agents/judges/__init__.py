"""SSR experience judges: the verdict schema and the judges that fill it (offline; LLM later)."""
