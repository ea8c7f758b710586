"""The package list, which pyproject.toml cannot express: ablate's packages, found, and the repository's grids/
folder (the shipped grids, tasks and suites) installed inside them as ablate/grids, where
ablate.config.paths.shipped_grids reads it. Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

setup(
    packages=find_namespace_packages(include=["ablate*"]) + ["ablate.grids"],
    package_dir={"ablate.grids": "grids"},
)
