"""SSR experience judges: the verdict schema and the judges that fill it (``offline``, and
``llm`` with its trajectory condensation in ``condense``)."""
