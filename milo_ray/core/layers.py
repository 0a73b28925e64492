"""The layer table: which parts of milo_ray may import which (docs/design.md, "Layers").

Layers are listed bottom first; a module may import from its own layer and the layers
below it, never from one above, and no import may close a cycle (``tests/test_layers.py``
checks both over every import statement of the package, top level and inside functions;
``if TYPE_CHECKING:`` blocks may point upward for annotations but still may not close a
cycle). A module belongs to the layer of the longest unit below that names it or one of
its parent packages; ``milo_ray`` itself names only the package's ``__init__``. A module
that no unit names fails the test: a new top-level package gets a row here.

Where a unit is a module inside a package that sits higher (the config checks inside
``config``), ``reason`` says why it sits apart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    name: str
    units: tuple[str, ...]
    reason: str = ""


# Bundled task content (the tasks' own code and tests), not part of the package's code.
NOT_CODE: tuple[str, ...] = ("milo_ray.data",)

LAYERS: tuple[Layer, ...] = (
    Layer("core", ("milo_ray", "milo_ray.core"),
          "value types every part shares: tasks and task formats, rollouts and cache keys, the executor "
          "protocol, seeds, endpoint-failure classification, this table"),
    Layer("schemas", ("milo_ray.config", "milo_ray.redaction"),
          "the config package's leaf modules (structured config dataclasses, where conf/ is, the --help text, "
          "the typed errors of bad input) and "
          "secret redaction (the store redacts what it writes)"),
    Layer("kernels", ("milo_ray.kernels",), "pure numpy/scipy functions"),
    Layer("store", ("milo_ray.store",), "the run store: Parquet tables, blobs, resume"),
    Layer("llm", ("milo_ray.llm",),
          "the LLM client: litellm calls, rate limits, usage and prices, role and solver calls; the model "
          "gateway forwards through it and the search agents are built on it"),
    Layer("boundary", ("milo_ray.boundary",),
          "the trust boundary: sandboxes, the harness and optimizer processes (the host side and what runs "
          "inside), the model gateway, files shipped between nodes, every host operation on a tree a sandbox "
          "wrote; below harness and benchmarks because a task format states the sandbox its task needs and a "
          "harness's import check runs in one"),
    Layer("harness", ("milo_ray.harness",), "the harness source model, diffs, validation, seed harnesses"),
    Layer("benchmarks", ("milo_ray.benchmarks",),
          "task specs and loaders, each real-task format, the surrogate (with its own executor)"),
    Layer("execution", ("milo_ray.execution",),
          "executors, the scheduler and its workers, the budget ledger, the cluster connection"),
    Layer("agents", ("milo_ray.agents",), "mutators, orchestrators, judges, embedder (offline and LLM)"),
    Layer("search", ("milo_ray.search", "milo_ray.context"),
          "services both methods share (mutation runner, recording, final test, event base) and the "
          "run context they are handed"),
    Layer("config checks", ("milo_ray.config.targets", "milo_ray.config.validate", "milo_ray.manifest",
                            "milo_ray.run_log"),
          "validation of a composed config against what it builds (agents, seeds, role caps), and the "
          "manifest and run.log that record a run"),
    Layer("methods", ("milo_ray.milo", "milo_ray.ssr", "milo_ray.evaluation", "milo_ray.evaluation_plugin"),
          "MILO, SSR, plain evaluation, each with its plugin"),
    Layer("read side", ("milo_ray.methods", "milo_ray.results", "milo_ray.einstein", "milo_ray.tracking",
                       "milo_ray.report"),
          "the method registry, results API, einstein record checks, run status and MLflow, the HTML report"),
    Layer("entry points", ("milo_ray.run", "milo_ray.sweep", "milo_ray.tasks", "milo_ray.integrations",
                           "milo_ray.testing"),
          "python -m milo_ray.run / .sweep / .tasks (the task check, and the run preflight it shares with run), "
          "adapters for other tools, and the test support package"),
)
