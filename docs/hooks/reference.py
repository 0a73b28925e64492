"""MkDocs hook: the reference pages generated from the code at every build, so they list
what the code accepts and cannot drift from it -- the configuration keys
(:func:`milo_ray.config.help.reference_page`, from ``conf/`` and the config schemas) and the
run's Parquet tables (from :data:`milo_ray.store.schema.COLUMNS`)."""

from __future__ import annotations

from mkdocs.structure.files import File


def tables_page() -> str:
    from milo_ray.store.schema import COLUMNS, SCHEMA_VERSION

    out = ["# Parquet tables", "",
           f"Generated from `milo_ray/store/schema.py` when the site is built (schema version {SCHEMA_VERSION}). "
           "One run is one directory; each table is a folder of immutable Parquet parts that DuckDB, pandas, "
           "polars and `pyarrow.dataset` read as one table (see [Querying results](../how-to/query-results.md)); "
           "what each column means is in [the design's data model](../design.md#3-data-model-parquet-one-run-one-directory). "
           "Every column is nullable in the file (older parts read back with nulls for newer columns); "
           "*required* columns are checked when a row is written.", ""]
    for table, cols in COLUMNS.items():
        out += [f"## `{table}`", "", "| column | type | rules |", "|---|---|---|"]
        for c in cols.values():
            rules = ["required" if c.required else ""]
            if c.json:
                rules.append("JSON text")
            if c.choices:
                rules.append("one of " + ", ".join(f"`{x}`" for x in c.choices))
            if c.max_chars:
                rules.append(f"at most {c.max_chars} characters")
            out.append(f"| `{c.name}` | `{c.type}` | {'; '.join(r for r in rules if r)} |")
        out.append("")
    return "\n".join(out) + "\n"


def on_files(files, config):
    from milo_ray.config.help import reference_page
    from milo_ray.config.paths import conf_dir

    for uri, content in (("reference/config.md", reference_page(str(conf_dir()))),
                         ("reference/tables.md", tables_page())):
        files.append(File.generated(config, uri, content=content))
    return files
