"""Hydra launcher plugin ``ray_jobs`` (``hydra/launcher=ray_jobs``): a thin shell over
:mod:`milo_ray.sweep`. Hydra's plugin loader scans the ``hydra_plugins`` namespace
package and imports this module, which registers the config in the ``hydra/launcher``
group."""
