"""Files cloudprof reads at run time (the shipped catalog, the VMs' first-boot script).

They are kept and edited in the checkout's ``infra/``; ``orchestrator/_data``
holds symlinks to them, so a checkout and an editable install read ``infra/``
itself, and ``pip install .`` and ``python -m build`` put copies of them in the
package (setuptools copies what a link points to). Found with
``importlib.resources``, never relative to a checkout, so an installed wheel
finds them wherever its ``site-packages`` is.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from orchestrator.errors import CloudprofError

DATA_DIR = "_data"


def data_path(*parts: str) -> Path:
    """The path of one packaged file or folder, e.g. ``data_path("catalog", "gcp.csv")``.

    A path on disk, not a resource stream: the catalog's messages, its cache
    keyed on mtime and ``CLOUDPROF_CATALOG_DIR`` all name real files. pip
    installs packages unzipped; a zipped install (a zipapp) is refused in one line.
    """
    resource = files(__package__ or "orchestrator") / DATA_DIR
    for part in parts:
        resource = resource / part
    if not isinstance(resource, Path):
        raise CloudprofError(
            f"cloudprof's packaged file {'/'.join(parts)} is inside an archive: "
            "install cloudprof unzipped (pip install cloudprof)"
        )
    return resource
