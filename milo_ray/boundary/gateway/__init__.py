"""The model gateway: the host-side endpoint that holds the provider keys, through which
every model call of a sandboxed harness goes (see :mod:`.server`)."""
