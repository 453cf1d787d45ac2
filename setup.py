"""Package layout: the repository keeps rules/, runtime/ and kernels/ at the top level (see
docs/design.md) and they install as subpackages of ``accrewrite``. setuptools needs the full package
list for such a mapping, so it is computed here rather than kept by hand in pyproject.toml."""

from setuptools import find_packages, setup

ROOTS = {
    "accrewrite": "accrewrite",
    "accrewrite.rules": "rules",
    "accrewrite.runtime": "runtime",
    "accrewrite.kernels": "kernels",
}

packages = []
for package, directory in ROOTS.items():
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_packages(directory)]

setup(
    packages=packages,
    package_dir=ROOTS,
    package_data={
        "accrewrite.rules": ["targets/*.toml"],
        "accrewrite.verify": ["hooks/sitecustomize.py"],  # put on a side's PYTHONPATH
        "accrewrite.runtime.compiler.cpu": ["*.cpp"],  # built at run time (cpu_kernels.py)
    },
)
