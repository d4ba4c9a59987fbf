"""Package discovery only (metadata lives in pyproject.toml).

``hooks/`` sits at the top level of the repository (design §2) but installs as
``slimdata.hooks``; setuptools' declarative ``find`` cannot express that rename.
"""

from setuptools import find_packages, setup

packages = find_packages(include=["slimdata", "slimdata.*", "pipelines", "pipelines.*"])
packages += ["slimdata." + p for p in find_packages(include=["hooks", "hooks.*"])]
setup(packages=packages, package_dir={"slimdata.hooks": "hooks"})
