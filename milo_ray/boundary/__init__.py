"""The trust boundary: the code that stands between what an untrusted process produces
(a harness, a mutator's coding agent, an optimizer program, a task's text, a model's
output) and everything else (the host, the keys, the store, the driver, other rollouts).
It is the code a reviewer must trust; ``docs/security.md`` gives the threat model and says,
channel by channel, which module here closes it.

What crosses, and where:

* **Processes** -- :mod:`.sandbox` opens every sandbox: ``bwrap`` (a uid leased per sandbox
  from ``sandbox.uid_range`` by :mod:`.sandbox.identity`, a seccomp filter compiled by
  :mod:`.sandbox.seccomp`, a cgroup per sandbox by :mod:`.sandbox.cgroups`, the storage
  volume of :mod:`.sandbox.volume`, a private network by :mod:`.sandbox.egress`),
  ``docker`` and the trusted-debugging ``local``; :mod:`.sandbox.leftovers` removes what a
  sandbox's run left on the host. A host-side helper that runs foreign code on a model's
  output for one rollout (an ARE scenario's world) runs in :mod:`.sandbox.helper_jail`.
* **Files in and out** -- every host operation on a tree a sandbox could write walks it
  without following links (:mod:`.nofollow`); a task's and a harness's files and the
  package code a sandbox sees are written by :mod:`.sandbox.hostdirs` and
  :mod:`.sandbox.runtime_code`; a solver's logs reach its verifier read-only through
  :mod:`.sandbox.carried`; trees between nodes travel as content-addressed archives
  (:mod:`.shipping`).
* **Model calls** -- :mod:`.gateway`: one socket per grant bound into its own sandbox
  only, the keys held outside, every call metered from the provider's own usage against
  the rollout's and the run's caps, upstream failures classified by the gateway alone.
* **A task's own tools** -- a task world's tools (an ARE scenario's) reach the harness
  through a socket in its own gateway directory, as LangChain tools built inside
  (:mod:`.inside.task_tools`).
* **Results** -- a harness process's stdout is read as bounded, schema-checked JSON lines
  (:mod:`.harness_process`, :mod:`.trajectory`); an optimizer program's result as files
  its sandbox wrote, size-capped (:mod:`.optimizer_process`). Text from either is made
  storable by :mod:`milo_ray.core.storable` before it reaches the store.

:mod:`.inside` is the other side: the programs that run *inside* a sandbox (the harness
process, its chat model and shell, the optimizer runner and its building blocks). Nothing
there is trusted; it is here so that both sides of each protocol read together.
"""
