"""Programs that run inside a sandbox, never on the host's side of it: the harness
process with its chat model (which speaks only to the gateway) and its shell backend, the
harness loader, and the optimizer runner with the building blocks it gives a program.
They import the standard library, their own third-party needs, each other and two boundary
modules without host effects (the trajectory schema, the process runner): a sandbox sees a
private copy of this package, and nothing a program there says is believed."""
